"""Provenance in every output (issue 17, item 4): records, points and sweep frames carry the
experiment file, profile, overrides, quick, repetitions, base seed, model version and a digest
of the inputs; a modified configuration is never shown as a reproduction."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pandas as pd
import pytest
from conftest import requires_native

import shootdown
from shootdown import _bridge, provenance, report
from shootdown.cli import app
from shootdown.records import (
    POINT_PROVENANCE_COLUMNS,
    RECORD_COLUMNS,
    build_records,
    concat_records,
    points_frame,
    summarize,
    to_dicts,
)

#: The columns the issue asks for, in the order they end RECORD_COLUMNS.
NEW_RECORD_COLUMNS = (
    "experiment_path",
    "sets",
    "quick",
    "repetitions",
    "rng_seed",
    "version",
    "inputs_sha256",
    "modified",
)


def invoke(runner, *args: Any):
    return runner.invoke(app, [str(a) for a in args])


def combined(*files: Path) -> str:
    """The expected ``inputs_sha256`` of a run that read ``files``, in order."""
    digests = [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- the columns


def test_provenance_columns_end_the_record_columns() -> None:
    assert RECORD_COLUMNS[-len(NEW_RECORD_COLUMNS) :] == NEW_RECORD_COLUMNS
    assert RECORD_COLUMNS[:4] == ("seed", "experiment", "title", "profile")  # unmoved
    assert set(provenance.PROVENANCE_COLUMNS) <= set(RECORD_COLUMNS)
    assert POINT_PROVENANCE_COLUMNS[-1] == "modified"


def test_records_from_the_fake_native_carry_their_provenance(fake_native, seed000) -> None:
    sets = ["workload.fake_noise=0.0", "experiment.quick_rows=[1, 8]", "experiment.rng_seed=7"]
    pts = shootdown.run(seed000, sets, quick=True)
    recs = shootdown.to_records(pts)
    assert tuple(recs.columns) == RECORD_COLUMNS
    profile = seed000.parents[2] / "profiles" / "test-profile.toml"
    expected = {
        "experiment_path": str(seed000),
        "profile": "test-profile",
        "sets": "workload.fake_noise=0.0; experiment.quick_rows=[1, 8]; experiment.rng_seed=7",
        "quick": True,
        "repetitions": 2,
        "rng_seed": 7,
        "version": shootdown.__version__,  # the fake has no extension file to digest
        "inputs_sha256": combined(seed000, profile),
        "modified": True,  # workload.fake_noise changes the workload
    }
    for rec in to_dicts(recs):
        assert {k: rec[k] for k in expected} == expected
        assert rec["direction_ok"] is None  # modified: no verdict
    # The points frame carries the same, with the base seed beside each run's own seed.
    assert list(pts.columns[-len(POINT_PROVENANCE_COLUMNS) :]) == list(POINT_PROVENANCE_COLUMNS)
    for row in to_dicts(pts):
        assert row["experiment"] == "seed000-test" and row["base_rng_seed"] == 7
        assert {k: row[k] for k in expected if k != "rng_seed"} == {
            k: v for k, v in expected.items() if k != "rng_seed"
        }
    assert pts["rng_seed"].nunique() > 1  # each run's own seed is still there


def test_selection_sets_keep_the_configuration(fake_native, seed000) -> None:
    recs = shootdown.to_records(shootdown.run(seed000, ["experiment.rows=[1, 8]"]))
    assert not recs["modified"].any()
    assert recs["sets"].tolist() == ["experiment.rows=[1, 8]"] * 4
    assert recs["quick"].tolist() == [False] * 4 and recs["repetitions"].tolist() == [3] * 4
    assert recs["rng_seed"].tolist() == [1] * 4  # the default base seed
    assert recs["direction_ok"].tolist() == [None, True, None, False]


def test_reproduce_fills_the_provenance(fake_native, data_home) -> None:
    recs = to_dicts(shootdown.reproduce(quick=True))
    seeds = data_home / "experiments" / "seeds"
    profile = data_home / "profiles" / "test-profile.toml"
    for rec in recs:
        file = seeds / ("000-sysbench.toml" if rec["seed"] == "000" else "002-dontneed.toml")
        assert rec["experiment_path"] == str(file)
        assert rec["inputs_sha256"] == combined(file, profile)
        assert rec["sets"] == "" and rec["quick"] is True and rec["modified"] is False
        assert rec["repetitions"] == (2 if rec["seed"] == "000" else 1)
        assert rec["rng_seed"] == 1 and rec["version"] == shootdown.__version__


def test_version_is_the_package_and_a_digest_of_the_build(fake_native, seed000, tmp_path) -> None:
    extension = tmp_path / "_native.so"
    extension.write_bytes(b"build 1")
    fake_native.__file__ = str(extension)
    digest = hashlib.sha256(b"build 1").hexdigest()[:16]
    version = f"{shootdown.__version__}+native.{digest}"
    assert provenance.model_version() == version
    recs = shootdown.to_records(shootdown.run(seed000, quick=True))
    assert set(recs["version"]) == {version}
    fake_native.__version__ = "9.9.9"  # an extension from another release says so
    assert provenance.model_version() == f"{shootdown.__version__}+native.9.9.9.{digest}"


def test_base_seed_comes_from_the_plan(fake_native, seed000) -> None:
    recs = shootdown.to_records(shootdown.run(seed000, ["experiment.rng_seed=7"], quick=True))
    assert set(recs["rng_seed"]) == {7}
    plan = shootdown.plan(seed000, quick=True)
    del plan["experiment"]["rng_seed"]  # a hand-made plan that does not say
    assert provenance.base_rng_seed(plan) is None


def test_hand_made_plans_and_old_records() -> None:
    plan: Dict[str, Any] = {
        "experiment": {"name": "x", "seed": None, "profile": "p", "repetitions": 1},
        "variants": [{"name": "a", "label": "a"}],
        "rows": [1],
        "published": [],
        "points": [{"index": 0, "row": 1, "variant": "a", "rep": 0, "seed": 3}],
    }
    result = {
        "index": 0,
        "row": 1,
        "variant": "a",
        "rep": 0,
        "value": 1.0,
        "sim_ns": 1.0,
        "steps": 1,
        "wall_s": 0.0,
        "counters": {},
        "violations": [],
    }
    recs = build_records(plan, summarize(points_frame(plan, [result]), plan))
    rec = to_dicts(recs)[0]
    assert rec["experiment_path"] is None and rec["inputs_sha256"] is None
    assert rec["sets"] == "" and rec["quick"] is None and rec["rng_seed"] is None
    assert rec["repetitions"] == 1 and rec["modified"] is False
    # Records written before the provenance columns existed still concatenate.
    old = recs.drop(columns=list(NEW_RECORD_COLUMNS))
    both = concat_records([old, recs])
    assert tuple(both.columns) == RECORD_COLUMNS
    first, second = to_dicts(both)
    assert first["version"] is None and first["sets"] is None and first["modified"] is False
    assert second["version"] == rec["version"] and second["repetitions"] == 1


# --------------------------------------------------------------------------- modified


@pytest.mark.parametrize(
    ("item", "modifies"),
    [
        ("variants.after.options.smp_call=concurrent", True),
        ('variants."after".label="x"', True),
        ("profile_override.cost.ipi_send=600", True),
        ("experiment.profile=other", True),
        ("experiment.row_key=vms", True),
        ("topology.sockets=1", True),
        ("host.vms=2", True),
        ("workload.iterations=50", True),
        ("quick.workload.duration_ms=1", True),
        ("published=[]", True),
        ("experiment.rows=[8]", False),
        ("experiment.quick_rows=[8]", False),
        (" experiment.repetitions = 2", False),
        ("experiment.quick_repetitions=1", False),
        ("experiment.rng_seed=7", False),
        ('experiment.title="renamed"', False),
    ],
)
def test_which_sets_modify_the_configuration(item: str, modifies: bool) -> None:
    assert provenance.is_modified([item]) is modifies
    assert provenance.modifying_sets(["experiment.rows=[8]", item]) == ([item] if modifies else [])


def test_sets_join_and_split() -> None:
    sets = ['workload.name="a; b=c"', "experiment.rows=[8]", "x.y={ a = '; z=1' }", 'w="; t"']
    assert provenance.split_sets(provenance.join_sets(sets)) == sets
    assert provenance.split_sets(provenance.join_sets(sets[1:2])) == sets[1:2]
    assert provenance.split_sets("") == [] and provenance.split_sets(None) == []
    assert provenance.split_sets("a=1; b=2") == ["a=1", "b=2"]
    assert provenance.split_sets('a="x; y"; b=2') == ['a="x; y"', "b=2"]


def table_rows(text: str) -> List[str]:
    return text.split("\n\n")[1].splitlines()[2:]


def test_a_modified_run_is_not_shown_as_a_reproduction(runner, fake_native, seed000) -> None:
    item = "variants.after.options.fake_factor=0.9"
    res = invoke(
        runner, "run", seed000, "--quick", "--set", "experiment.quick_rows=[1,8]", "--set", item
    )
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    title = text.splitlines()[0]
    assert title == (
        f"seed 000 · sysbench fileio rndwr (fake) · events/10s · quick (modified: --set {item})"
    )
    assert "✓" not in text and "✗" not in text and "MISMATCH" not in text
    assert "directions:" not in text
    header = text.split("\n\n")[1].splitlines()[0]
    assert "seed's pub tip-jun28 avg (stdev)" in header and "  pub tip-jun28" not in header
    assert "seed's pub change" in header
    rows = table_rows(text)
    assert all(r.rstrip().endswith(report.MODIFIED_MARK) for r in rows), rows
    assert "1267765 (14146)" in rows[0]  # the published numbers are still shown, labelled
    assert "not comparable with this run: no direction is judged" in text

    res = invoke(runner, "run", seed000, "--quick", "--set", item, "--format", "json")
    recs = json.loads(res.stdout)
    assert all(r["modified"] is True and r["direction_ok"] is None for r in recs)
    assert all(r["published_direction"] is not None for r in recs if not r["baseline"])
    assert all(r["sets"] == item for r in recs)


def test_selection_sets_still_compare(runner, fake_native, seed000) -> None:
    res = invoke(runner, "run", seed000, "--set", "experiment.rows=[8]")
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    assert text.splitlines()[0] == "seed 000 · sysbench fileio rndwr (fake) · events/10s"
    assert "modified" not in text and "seed's pub" not in text
    assert table_rows(text)[0].rstrip().endswith("✗ MISMATCH")
    assert "directions 0 of 1 match, 1 MISMATCH" in text


def test_a_modified_run_without_published_numbers(fake_native, data_home) -> None:
    seed002 = data_home / "experiments" / "seeds" / "002-dontneed.toml"
    recs = shootdown.to_records(
        shootdown.run(seed002, ["published=[]", "workload.fake_noise=0.0"], quick=True)
    )
    text = report.format_table(recs)
    assert text.splitlines()[0].endswith(
        "(modified: --set published=[], --set workload.fake_noise=0.0)"
    )
    assert "pub" not in text.split("\n\n")[1] and "no direction is judged" not in text


def test_one_table_per_configuration(fake_native, seed000) -> None:
    plain = shootdown.to_records(shootdown.run(seed000, quick=True))
    changed = shootdown.to_records(
        shootdown.run(seed000, ["variants.after.options.fake_factor=0.9"], quick=True)
    )
    text = report.format_table(concat_records([plain, changed]))
    titles = [b.splitlines()[0] for b in text.split("\n\n") if b.startswith("seed 000")]
    assert len(titles) == 2 and "modified" not in titles[0] and "modified" in titles[1]
    assert "✓" in text and report.MODIFIED_MARK in text


# --------------------------------------------------------------------------- outputs


def test_json_and_csv_outputs_carry_the_columns(runner, fake_native, data_home, seed000) -> None:
    res = invoke(runner, "reproduce", "--quick", "--format", "json")
    assert res.exit_code == 0, res.stderr
    for rec in json.loads(res.stdout):
        assert list(rec)[-len(NEW_RECORD_COLUMNS) :] == list(NEW_RECORD_COLUMNS)
        assert rec["quick"] is True and rec["sets"] == "" and isinstance(rec["rng_seed"], int)

    res = invoke(runner, "run", seed000, "--quick", "-s", "experiment.rng_seed=9", "-f", "csv")
    assert res.exit_code == 0, res.stderr
    back = pd.read_csv(io.StringIO(res.stdout), dtype={"seed": str})
    assert list(back.columns) == list(RECORD_COLUMNS)
    assert back["sets"].tolist() == ["experiment.rng_seed=9"] * 4
    assert back["rng_seed"].tolist() == [9] * 4 and back["quick"].tolist() == [True] * 4
    assert back["modified"].tolist() == [False] * 4
    assert back["experiment_path"].tolist() == [str(seed000)] * 4

    res = invoke(runner, "run", seed000, "--quick", "--points", "-f", "json")
    pts = json.loads(res.stdout)
    assert all(
        list(p)[-len(POINT_PROVENANCE_COLUMNS) :] == list(POINT_PROVENANCE_COLUMNS) for p in pts
    )
    assert {p["base_rng_seed"] for p in pts} == {1} and {p["quick"] for p in pts} == {True}

    res = invoke(runner, "run", seed000, "--quick", "--points")
    first = res.stdout.splitlines()[0]
    assert first.startswith("experiment seed000-test · experiment_path ")
    assert "base_rng_seed 1" in first and "modified False" in first
    assert "inputs_sha256" not in res.stdout.splitlines()[2]  # not repeated per run


def test_parquet_round_trips_the_provenance(
    runner, fake_native, data_home, seed000, tmp_path
) -> None:
    pytest.importorskip("pyarrow")
    records = shootdown.reproduce(quick=True)
    out = tmp_path / "r.parquet"
    report.to_parquet(records, out)
    back = pd.read_parquet(out)
    assert list(back.columns) == list(RECORD_COLUMNS)
    for col in NEW_RECORD_COLUMNS:
        assert to_dicts(back[[col]]) == to_dicts(records[[col]]), col

    pts_out = tmp_path / "p.parquet"
    item = "variants.after.options.fake_factor=0.9"
    res = invoke(runner, "run", seed000, "--quick", "--set", item, "--parquet", pts_out)
    assert res.exit_code == 0, res.stderr
    pts = pd.read_parquet(pts_out)
    assert list(pts.columns[-len(POINT_PROVENANCE_COLUMNS) :]) == list(POINT_PROVENANCE_COLUMNS)
    first = to_dicts(pts)[0]
    assert first["sets"] == item and first["modified"] is True and first["quick"] is True
    assert first["base_rng_seed"] == 1 and first["repetitions"] == 2
    assert first["experiment_path"] == str(seed000)


def test_sweep_frames_carry_each_combinations_provenance(fake_native, seed000, tmp_path) -> None:
    grid = {"experiment.quick_rows": [[1], [8]], "variants.after.options.fake_factor": [1.1]}
    frame = shootdown.sweep(seed000, grid, cache_dir=tmp_path / "c", quick=True)
    by_combo = frame.groupby("combo")["sets"].unique().to_dict()
    assert {k: list(v) for k, v in by_combo.items()} == {
        0: ["experiment.quick_rows=[1]; variants.after.options.fake_factor=1.1"],
        1: ["experiment.quick_rows=[8]; variants.after.options.fake_factor=1.1"],
    }
    assert frame["modified"].all() and (frame["quick"] == True).all()  # noqa: E712
    assert list(frame.columns[-len(POINT_PROVENANCE_COLUMNS) - 1 : -1]) == list(
        POINT_PROVENANCE_COLUMNS
    )
    assert frame.columns[-1] == "cached"

    rows_only = shootdown.sweep(
        seed000, {"experiment.quick_rows": [[1], [8]]}, cache_dir=tmp_path / "c", quick=True
    )
    assert not rows_only["modified"].any()
    summary = shootdown.summarize_sweep(rows_only)
    assert list(summary.columns[-len(provenance.PROVENANCE_COLUMNS) :]) == list(
        provenance.PROVENANCE_COLUMNS
    )
    assert summary.groupby("combo")["sets"].first().tolist() == [
        "experiment.quick_rows=[1]",
        "experiment.quick_rows=[8]",
    ]
    assert set(summary["rng_seed"]) == {1} and not summary["modified"].any()


# --------------------------------------------------------------------------- the real model

_M64 = (1 << 64) - 1


def _mix_seed(a: int, b: int) -> int:
    """``shootdown_engine::rng::mix_seed`` (splitmix64's finalizer over ``a ^ b·φ``)."""
    z = a ^ ((b * 0x9E3779B97F4A7C15) & _M64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _value_seed(row: Any) -> int:
    """``value_seed`` of crates/shootdown-experiments/src/spec.rs for int and plain str rows."""
    data = (f'"{row}"' if isinstance(row, str) else str(row)).encode()
    h = len(data)
    for i in range(0, len(data), 8):
        h = _mix_seed(h, int.from_bytes(data[i : i + 8].ljust(8, b"\0"), "little"))
    return h


@pytest.fixture
def real_native(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_bridge, "_override", None)
    monkeypatch.delenv("SHOOTDOWN_HOME", raising=False)
    return _bridge.native()


@requires_native
def test_real_records_carry_their_provenance(real_native) -> None:
    sets = ["experiment.rng_seed=7", "experiment.quick_repetitions=2"]
    pts = shootdown.run("seed002-madv-dontneed", sets, quick=True, threads=2)
    plan = pts.attrs["plan"]
    assert plan["sets"] == sets
    recs = to_dicts(shootdown.to_records(pts))
    path = Path(plan["experiment"]["path"])
    assert path.name == "seed002-madv-dontneed.toml"
    files = [Path(i["path"]) for i in plan["inputs"]]
    assert files[0].resolve() == path.resolve() and len(files) >= 2
    version = provenance.model_version()
    assert re.fullmatch(re.escape(shootdown.__version__) + r"\+native\.[0-9a-f]{16}", version)
    for rec in recs:
        assert rec["experiment_path"] == str(path)
        assert rec["profile"] == plan["experiment"]["profile"] == "skylake-laptop-kvm-guest"
        assert rec["sets"] == "experiment.rng_seed=7; experiment.quick_repetitions=2"
        assert rec["quick"] is True and rec["repetitions"] == 2 and rec["n"] == 2
        assert rec["rng_seed"] == 7
        assert rec["version"] == version
        assert rec["inputs_sha256"] == combined(*files)
        assert rec["modified"] is False
    # The base seed is the one every run's seed was mixed from (row value, then repetition).
    for p in plan["points"]:
        assert p["seed"] == _mix_seed(_mix_seed(7, _value_seed(p["row"])), p["rep"])
    assert set(pts["base_rng_seed"]) == {7}


@requires_native
def test_real_modified_run_has_no_verdicts(runner, real_native) -> None:
    item = "variants.after.options.lazy_tlb=legacy"
    res = invoke(runner, "run", "seed002-madv-dontneed", "--quick", "--set", item, "-f", "json")
    assert res.exit_code == 0, res.stderr
    recs = json.loads(res.stdout)
    assert recs and all(r["modified"] is True and r["direction_ok"] is None for r in recs)
    res = invoke(runner, "run", "seed002-madv-dontneed", "--quick", "--set", item)
    assert res.exit_code == 0, res.stderr
    assert f"(modified: --set {item})" in res.stdout.splitlines()[0]
    assert "✓" not in res.stdout and "✗" not in res.stdout
