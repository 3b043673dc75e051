"""End-to-end tests with the REAL Rust extension and the repository's seed experiments.

Skipped only when ``shootdown._native`` cannot be imported.
"""

from __future__ import annotations

import json

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
