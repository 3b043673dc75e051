"""The Python API against the fake native module."""

from __future__ import annotations

import json
import math

import pytest

import shootdown
from shootdown.records import RECORD_COLUMNS


def test_plan_passes_arguments(fake_native, seed000) -> None:
    plan = shootdown.plan(seed000, ["workload.fake_noise=0.0"], quick=True)
    assert plan["rows"] == [1, 8]
    assert [v["name"] for v in plan["variants"]] == ["before", "after"]
    assert len(plan["points"]) == 2 * 2 * 2
    assert fake_native.calls[-1] == ("plan", (str(seed000), ["workload.fake_noise=0.0"], True))


def test_run_chunks_progress_and_columns(fake_native, seed000) -> None:
    seen = []
    pts = shootdown.run(seed000, threads=2, progress=lambda done, total: seen.append((done, total)))
    n = 4 * 2 * 3
    assert len(pts) == n and pts["index"].tolist() == list(range(n))
    chunks = [args[3] for fn, args in fake_native.calls if fn == "run_points"]
    assert [len(c) for c in chunks] == [4] * 6  # chunk = 2 × threads
    assert all(args[4] == 2 for fn, args in fake_native.calls if fn == "run_points")
    assert seen[0] == (0, n) and seen[-1] == (n, n) and len(seen) == 7
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    for col in (
        "index",
        "row",
        "variant",
        "label",
        "rep",
        "value",
        "sim_ns",
        "steps",
        "wall_s",
        "c.nr_tlb_remote_flush",
        "c.tlb_shootdown_ipis",
        "violations",
    ):
        assert col in pts.columns
    assert pts.attrs["plan"]["experiment"]["name"] == "seed000-test"


def test_results_do_not_depend_on_threads(fake_native, seed000) -> None:
    a = shootdown.run(seed000, threads=1)
    b = shootdown.run(seed000, threads=7)
    assert a["value"].tolist() == b["value"].tolist()


def test_summarize_and_records_from_run(fake_native, seed000) -> None:
    pts = shootdown.run(seed000, quick=True)
    summary = shootdown.summarize(pts)
    assert summary["n"].tolist() == [2, 2, 2, 2]
    assert summary["published"].iloc[0] == 1267765.0
    recs = shootdown.to_records(pts)
    assert tuple(recs.columns) == RECORD_COLUMNS


def test_reproduce_all_and_filtered(fake_native, data_home) -> None:
    allrec = shootdown.reproduce(quick=True)
    assert allrec["seed"].drop_duplicates().tolist() == ["000", "002"]
    assert tuple(allrec.columns) == RECORD_COLUMNS
    only = shootdown.reproduce(["002"], quick=True)
    assert set(only["seed"]) == {"002"}
    by_name = shootdown.reproduce(["seed000-test"], quick=True)
    assert set(by_name["experiment"]) == {"seed000-test"}
    rec = shootdown.records.to_dicts(only)
    assert rec[1]["direction"] == "down" and rec[1]["published_direction"] == "down"
    assert rec[1]["direction_ok"] is True and rec[0]["direction_ok"] is None
    assert rec[0]["published_stdev"] is None


def test_reproduce_progress_spans_all_experiments(fake_native, data_home) -> None:
    seen = []
    shootdown.reproduce(quick=True, threads=1, progress=lambda d, t: seen.append((d, t)))
    total = 2 * 2 * 2 + 1 * 2 * 1
    assert seen[0] == (0, total) and seen[-1] == (total, total)


def test_reproduce_unknown_id(fake_native, data_home) -> None:
    with pytest.raises(shootdown.ConfigError, match=r": 999: no seed experiment"):
        shootdown.reproduce(["999"])


def test_missing_file_is_a_config_error(fake_native, tmp_path) -> None:
    with pytest.raises(
        shootdown.ConfigError, match=r"nope\.toml: experiment: no such file or shipped experiment"
    ):
        shootdown.run(tmp_path / "nope.toml")
    assert issubclass(shootdown.ConfigError, ValueError)


def test_bad_set_is_a_config_error(fake_native, seed000) -> None:
    with pytest.raises(shootdown.ConfigError) as info:
        shootdown.run(seed000, ["bogus.key=1"])
    assert str(info.value) == f"{seed000}: bogus.key: unknown key"


def test_trace_selects_row_and_variant(fake_native, seed000, tmp_path) -> None:
    out = tmp_path / "t.json"
    assert shootdown.trace(seed000, out, row="4", variant="+patch-set") == out
    fn, args = fake_native.calls[-1]
    assert fn == "trace" and args[3] == 2 and args[4] == "after"
    assert json.loads(out.read_text())["traceEvents"]
    shootdown.trace(seed000, out)
    assert fake_native.calls[-1][1][3:5] == (0, "before")
    with pytest.raises(shootdown.ConfigError, match="row: no row 3"):
        shootdown.trace(seed000, out, row=3)
    with pytest.raises(shootdown.ConfigError, match="variant: no variant x"):
        shootdown.trace(seed000, out, variant="x")


def test_check_resolves_names_and_defaults(fake_native, data_home) -> None:
    res = shootdown.check("lazy-switch")
    assert res["verdict"] == "verified"
    fn, args = fake_native.calls[-1]
    assert args[0] == str(data_home / "scenarios" / "lazy-switch.toml")
    assert args[2:] == ("sc", None, None, 0, "auto", True)  # the bound: from memory, in Rust
    shootdown.check("lazy-switch", sample=10, seed=3)
    assert fake_native.calls[-1][1][4:] == (10, 3, "random", True)
    shootdown.check("lazy-switch", symmetry=False)
    assert fake_native.calls[-1][1][7] is False
    with pytest.raises(shootdown.ConfigError, match="no such scenario"):
        shootdown.check("nope")


def test_check_list_and_bench(fake_native, data_home, seed000) -> None:
    names = [s["scenario"] for s in shootdown.check_list()]
    assert names == ["lazy-switch", "pv-flush"]
    b = shootdown.bench(seed000)
    assert b["steps_per_s"] > 0 and not math.isnan(b["sim_s_per_wall_s"])


def test_native_unavailable_message(monkeypatch) -> None:
    from shootdown import _bridge

    monkeypatch.setattr(_bridge, "_override", None)
    monkeypatch.setattr(
        _bridge.importlib, "import_module", lambda name: (_ for _ in ()).throw(ImportError("gone"))
    )
    with pytest.raises(shootdown.NativeUnavailableError, match="maturin develop"):
        _bridge.native()
