"""End-to-end tests with the REAL Rust extension and the repository's seed experiments.

Skipped only when ``shootdown._native`` cannot be imported.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import requires_native

from shootdown import _bridge
from shootdown.cli import app
from shootdown.records import RECORD_COLUMNS

pytestmark = requires_native


@pytest.fixture
def real_native(monkeypatch: pytest.MonkeyPatch):
    """The real module, the repository's data (no fake, no $SHOOTDOWN_HOME)."""
    monkeypatch.setattr(_bridge, "_override", None)
    monkeypatch.delenv("SHOOTDOWN_HOME", raising=False)
    return _bridge.native()


def test_reproduce_quick_json_for_seeds_000_and_002(runner, real_native) -> None:
    result = runner.invoke(app, ["reproduce", "000", "002", "--quick", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    records = json.loads(result.stdout)
    assert isinstance(records, list) and records
    assert {r["seed"] for r in records} == {"000", "002"}
    for rec in records:
        assert set(RECORD_COLUMNS) <= set(rec), set(RECORD_COLUMNS) - set(rec)
        assert isinstance(rec["simulated"], float) and rec["n"] >= 1
        assert rec["direction"] in (None, "up", "down", "flat")
        if not rec["baseline"]:
            assert rec["direction"] is not None and rec["change_pct"] is not None
    for seed in ("000", "002"):
        mine = [r for r in records if r["seed"] == seed]
        assert any(r["published"] is not None for r in mine), (
            f"seed {seed} has no published numbers"
        )
        assert any(r["direction_ok"] is not None for r in mine)


def test_reproduce_table_marks_directions(runner, real_native) -> None:
    result = runner.invoke(app, ["reproduce", "002", "--quick"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("seed 002 · ")
    assert "✓" in result.stdout or "✗ MISMATCH" in result.stdout


def test_run_is_deterministic_across_threads(real_native) -> None:
    import shootdown
    from shootdown.api import run_plan

    file, plan = shootdown.seed_experiments(["000"], quick=True)[0]
    some = [p["index"] for p in plan["points"]][:4]
    a = run_plan(file, plan, quick=True, threads=1, indices=some)
    b = run_plan(file, plan, quick=True, threads=3, indices=some)
    assert a["index"].tolist() == some
    assert a["value"].tolist() == b["value"].tolist()
    assert any(c.startswith("c.") for c in a.columns)


def test_config_error_from_rust_is_one_line(runner, real_native) -> None:
    import shootdown

    file = shootdown.seed_experiments(["000"], quick=True)[0][0]
    result = runner.invoke(app, ["run", str(file), "--quick", "--set", "no_such_table.key=1"])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("shootdown: error: ")
    assert file.name in lines[0] and "no_such_table" in lines[0]
    assert issubclass(shootdown.ConfigError, ValueError)


def test_profile_compares_variants_per_function(runner, real_native) -> None:
    import shootdown
    from shootdown import profiling

    file = shootdown.seed_experiments(["000"], quick=True)[0][0]
    sets = [
        "experiment.repetitions=1",
        "workload.warmup_ms=0.2",
        "workload.measure_ms=0.5",
    ]
    frame = shootdown.profile(file, row=4, sets=sets, threads=2)
    assert set(frame["variant"]) == {"before", "after"}
    # Per run, the exclusive times of all slices add up to all CPU time of the window.
    for _, run in frame.groupby(["variant", "rep"]):
        total = run.loc[run["function"] == profiling.TOTAL, "exclusive_ns"].sum()
        rest = run.loc[run["function"] != profiling.TOTAL, "exclusive_ns"].sum()
        assert abs(rest - total) <= 1e-6 * total
    summary = profiling.summarize_profile(frame)
    flush = summary.set_index("function").loc["flush_tlb_mm_range"]
    assert flush["before:calls/event"] > 0
    assert flush["after:calls/event"] > 0
    assert "Δ after:ns/event" in summary.columns

    args = ["profile", str(file), "--row", "4", "--top", "3"]
    result = runner.invoke(app, args + sum((["--set", s] for s in sets), []))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("threads = 4 · 1 repetition(s) per variant")
    assert "Δ after ns/ev" in lines[2]
    # 3 functions, then idle and the total.
    assert lines[-4].startswith("idle") and lines[-3].startswith("total")

    as_csv = runner.invoke(
        app, args + ["--variant", "after", "-f", "csv"] + sum((["--set", s] for s in sets), [])
    )
    assert as_csv.exit_code == 0, as_csv.stderr
    header = as_csv.stdout.splitlines()[0].split(",")
    assert header[:2] == ["function", "after:calls/event"] and not any("Δ" in h for h in header)

    bad = runner.invoke(app, args + ["--variant", "nope"])
    assert bad.exit_code == 2 and "no variant nope" in bad.stderr


def _forget_shipped_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset $SHOOTDOWN_SHIPPED_PROFILES (restored after the test) and let the bridge set it
    again on its next call."""
    monkeypatch.setenv(_bridge.ENV_SHIPPED_PROFILES, "")
    monkeypatch.delenv(_bridge.ENV_SHIPPED_PROFILES)
    monkeypatch.delenv("SHOOTDOWN_PROFILES", raising=False)
    monkeypatch.setattr(_bridge, "_shipped_profiles_exported", False)


def test_a_copied_experiment_finds_the_shipped_profiles(
    runner, real_native, tmp_path, monkeypatch
) -> None:
    import shutil

    import shootdown
    from shootdown import paths

    copy = tmp_path / "mine.toml"  # no profiles/ anywhere above it
    shutil.copy(paths.seeds_dir() / "seed002-madv-dontneed.toml", copy)
    _forget_shipped_profiles(monkeypatch)
    plan = shootdown.plan(copy, quick=True)
    assert plan["experiment"]["profile"] == "skylake-laptop-kvm-guest"
    assert plan["inputs"][1]["path"].endswith("skylake-laptop-kvm-guest.toml")
    assert os.environ[_bridge.ENV_SHIPPED_PROFILES] == str(paths.profiles_dir())
    # The CLI too, from the copy's directory.
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", "mine.toml", "--quick", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert {r["experiment"] for r in json.loads(result.stdout)} == {"seed002-madv-dontneed"}
    # Without the variable the Rust core does not find the profile: the variable is what works.
    monkeypatch.delenv(_bridge.ENV_SHIPPED_PROFILES)
    with pytest.raises(shootdown.ConfigError, match="no profile 'skylake-laptop-kvm-guest'"):
        shootdown.plan(copy, quick=True)


def test_sweep_cache_recomputes_exactly_what_an_edit_affects(
    real_native, tmp_path, monkeypatch
) -> None:
    """Issue 17: every input of a point is in its cache key — the experiment file, its profile,
    the profile that one inherits, profile_override values, --set and quick — and nothing
    else: unaffected points still come from the cache."""
    import shutil

    from shootdown import paths
    from shootdown.sweep import sweep

    _forget_shipped_profiles(monkeypatch)
    tree = tmp_path / "tree"
    (tree / "experiments").mkdir(parents=True)
    (tree / "profiles").mkdir()
    experiment = tree / "experiments" / "e.toml"
    shutil.copy(paths.seeds_dir() / "seed000-sysbench-mitigations.toml", experiment)
    child, base = "haswell-x-2s48t-mitigations", "haswell-x-2s48t"
    for name in (child, base):
        shutil.copy(paths.profiles_dir() / f"{name}.toml", tree / "profiles" / f"{name}.toml")
    assert f'inherits = "{base}"' in (tree / "profiles" / f"{child}.toml").read_text()
    sets = [  # one row, one repetition, a short window and a small file: ~0.1 s a sweep
        "experiment.rows=[1]",
        "experiment.quick_rows=[1]",
        "experiment.repetitions=1",
        "experiment.quick_repetitions=1",
        "workload.warmup_ms=0.2",
        "workload.measure_ms=0.5",
        "workload.file_total_size_mb=64",
    ]
    grid = {"experiment.profile": [child, base], "profile_override.cost.invlpg": [120, 240]}
    cache = tmp_path / "cache"

    def cached(extra=(), quick=True):
        frame = sweep(
            experiment, grid, cache_dir=cache, sets=sets + list(extra), quick=quick, threads=2
        )
        assert len(frame) == 4 * 2  # 4 combinations × 2 variants
        flags = {}
        for (profile, invlpg), group in frame.groupby(list(grid))["cached"]:
            assert group.nunique() == 1, group  # a combination is all cached or all run
            flags[(profile, int(invlpg))] = bool(group.iloc[0])
        return flags

    def expect(child_cached: bool, base_cached: bool, values=(120, 240)) -> dict:
        return {
            (p, v): (child_cached if p == child else base_cached)
            for p in (child, base)
            for v in values
        }

    def edit(path) -> None:
        path.write_text(path.read_text() + "\n# edited\n")

    assert cached() == expect(False, False)
    plans = sweep(experiment, grid, cache_dir=cache, sets=sets, quick=True).attrs["plans"]
    assert [i["path"] for i in plans[0]["inputs"]] == [
        str(experiment),
        str(tree / "profiles" / f"{child}.toml"),
        str(tree / "profiles" / f"{base}.toml"),
    ]
    assert plans[0]["experiment"]["profile"] == f"{child} + override(cost.invlpg)"
    assert cached() == expect(True, True)

    edit(experiment)
    assert cached() == expect(False, False)
    edit(tree / "profiles" / f"{child}.toml")  # read only by the child's combinations
    assert cached() == expect(False, True)
    edit(tree / "profiles" / f"{base}.toml")  # inherited: read by all
    assert cached() == expect(False, False)
    assert cached() == expect(True, True)

    grid["profile_override.cost.invlpg"] = [120, 360]  # a new override value
    assert cached() == {
        (child, 120): True,
        (child, 360): False,
        (base, 120): True,
        (base, 360): False,
    }
    assert cached(["workload.user_ns_per_request=1100"]) == expect(False, False, (120, 360))
    assert cached() == expect(True, True, (120, 360))  # the original --set: from the cache
    assert cached(quick=False) == expect(False, False, (120, 360))
    assert cached(quick=True) == expect(True, True, (120, 360))


def test_check_list_names_each_catalogued_bug_with_its_fix(runner, real_native) -> None:
    # Every mutant that re-creates a catalogued bug names the bug's fixing commit (and CVEs)
    # from docs/bugs/CATALOG.md, in JSON and in text; a real bug's mutant has an id.
    result = runner.invoke(app, ["check", "--list", "--format", "json"])
    assert result.exit_code == 0, result.output
    mutants = [m for sc in json.loads(result.output) for m in sc["mutants"]]
    catalogued = [m for m in mutants if m["bug"]]
    assert len({m["bug"] for m in catalogued}) >= 15
    for m in catalogued:
        assert m["fix"], m
    k1 = next(m for m in mutants if m["name"] == "pv_set_preempted_clobbers_flush")
    assert (k1["bug"], k1["cves"], k1["fix"]) == ("K1", ["CVE-2019-3016"], "8c6de56a42e0")
    for m in mutants:
        text = m["description"]
        if "CVE-" in text or "fixed by" in text or text.startswith("before "):
            assert m["bug"], f"{m['name']} describes a real bug but names no catalog id"
    text = runner.invoke(app, ["check", "--list"]).output
    assert "[A1 · CVE-2025-22045 · fix 3ef938c35035]" in text
