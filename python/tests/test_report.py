"""Table, CSV, Parquet, checker and bench formatting."""

from __future__ import annotations

import builtins
import io

import pandas as pd
import pytest

import shootdown
from shootdown import report
from shootdown.records import RECORD_COLUMNS


def test_choose_decimals_follows_the_seed_conventions() -> None:
    assert report.choose_decimals([1267765.0, 14146.0]) == 0
    assert report.choose_decimals([1000.0]) == 0
    assert report.choose_decimals([21.6, 13.4]) == 1
    assert report.choose_decimals([89.117, 84.768]) == 1
    assert report.choose_decimals([1.1, 1.9]) == 2
    assert report.choose_decimals([0.0123]) == 4
    assert report.choose_decimals([None, float("nan")]) == 0
    assert report.format_number(1267765.4, 0) == "1267765"
    assert report.format_number(13.42, 1) == "13.4"
    assert report.format_number(None, 1) == "–"
    assert report.format_change(2.44) == "+2.4%"
    assert report.format_change(-0.26) == "-0.3%"


def test_format_table_like_the_cover_letters(fake_native, data_home) -> None:
    records = shootdown.reproduce(quick=True, threads=2)
    text = report.format_table(records)
    blocks = text.strip().split("\n\n")
    assert blocks[0] == "seed 000 · sysbench fileio rndwr (fake) · events/10s · quick"
    header, dashes, *rows = blocks[1].splitlines()
    assert header.split("  ")[0] == "threads"
    for col in (
        "tip-jun28 avg (stdev)",
        "+patch-set avg (stdev)",
        "change",
        "pub tip-jun28 avg (stdev)",
        "pub +patch-set avg (stdev)",
        "pub change",
        "dir",
    ):
        assert col in header
    assert set(dashes.replace(" ", "")) == {"-"}
    assert rows[0].startswith("1 ") and "1267765 (14146)" in rows[0] and "1299253 (5715)" in rows[0]
    assert rows[0].rstrip().endswith("✓")  # +5 % simulated, +2.5 % published
    assert rows[1].startswith("8 ") and rows[1].rstrip().endswith("✗ MISMATCH")  # up vs down
    assert "+5.2%" in rows[0] and "+2.5%" in rows[0] and "-4.1%" in rows[1]
    assert blocks[2] == (
        "predicted changes: directions 1 of 2 match, 1 MISMATCH; 0 of 2 in band (within"
        " max(2 pp, 25%) of the published change)\n"
        "the changes that miss, and why: docs/reproduction.md, section 'Seed 000'"
    )
    # seed 002: small published values keep one decimal like the cover letter
    assert blocks[3] == "seed 002 · MADV_DONTNEED + migrate (fake) · µs · quick"
    assert "modified" not in text
    row = blocks[4].splitlines()[2]
    assert "21.6" in row and "13.4" in row and row.startswith("dontneed")


def test_format_table_without_published_numbers(fake_native, seed000) -> None:
    pts = shootdown.run(seed000, sets=['experiment.seed=""'], quick=True)
    recs = shootdown.to_records(pts)
    recs["published"] = float("nan")
    recs["direction_ok"] = None
    text = report.format_table(recs)
    assert text.startswith("seed000-test · sysbench")  # no seed id: the experiment name
    assert "pub " not in text and "dir" not in text and "directions" not in text


def test_format_table_marks_fitted_cells(fake_native, seed000) -> None:
    pts = shootdown.run(seed000, quick=True)
    recs = shootdown.to_records(pts)
    assert (recs["fitted"] == "").all()  # the fake plan fits nothing
    assert "fitted" not in report.format_table(recs)
    recs.loc[recs.index[1], "fitted"] = "user_touch_page"
    text = report.format_table(recs)
    rows = text.split("\n\n")[1].splitlines()[2:]
    marked = [r for r in rows if ")*" in r]
    assert len(marked) == 1 and marked[0] == rows[0], text
    assert (
        "* fitted: profile test-profile fits user_touch_page on this cell; "
        "every other cell is a prediction"
    ) in text.split("\n\n")[2], text


def test_a_fitted_change_is_listed_apart_and_not_counted(fake_native, seed000) -> None:
    """A change whose cell (or whose row's baseline cell) a cost was fitted on is no
    prediction: build_records flags it and the summary lists it apart."""
    from shootdown.records import build_records, summarize

    pts = shootdown.run(seed000, quick=True)
    plan = pts.attrs["plan"]
    summary = summarize(pts, plan)
    base = summary.index[(summary["baseline"]) & (summary["row"] == 8)][0]
    summary.loc[base, "fitted"] = "line_cross_socket"
    recs = build_records(plan, summary)
    flags = dict(zip(zip(recs["row"], recs["variant"]), recs["change_fitted"]))
    assert flags[(8, "after")] is True and flags[(1, "after")] is False
    assert flags[(8, "before")] is None  # a baseline has no change
    text = report.format_table(recs)
    summary_lines = text.split("\n\n")[3].splitlines()
    assert summary_lines[0].startswith("predicted changes: directions 1 of 1 match; 0 of 1 in band")
    assert summary_lines[1] == "fitted changes, not counted: 8 +patch-set (✗, out of band)"


def test_in_band_is_two_points_or_a_quarter() -> None:
    from shootdown.records import in_band

    assert in_band(3.9, 2.0) and not in_band(4.1, 2.0)  # 2 pp for small changes
    assert in_band(120.0, 100.0) and not in_band(130.0, 100.0)  # 25 % for large ones
    assert in_band(float("nan"), 1.0) is None


def test_format_table_reports_violations(fake_native, seed000) -> None:
    pts = shootdown.run(seed000, sets=["variants.after.options.fake_violation=true"], quick=True)
    assert any(pts["violations"].map(len))
    text = report.format_table(shootdown.to_records(pts))
    assert "invariant violations in simulated runs: 4" in text


def test_empty_table() -> None:
    assert report.format_table(pd.DataFrame(columns=list(RECORD_COLUMNS))) == "no records\n"


def test_csv_roundtrip(fake_native, data_home, tmp_path) -> None:
    records = shootdown.reproduce(["000"], quick=True)
    text = report.to_csv(records)
    back = pd.read_csv(io.StringIO(text), dtype={"seed": str})
    assert list(back.columns) == list(RECORD_COLUMNS)
    assert back["seed"].tolist() == ["000"] * 4
    out = tmp_path / "r.csv"
    assert report.to_csv(records, out) is None and out.read_text() == text


def test_points_csv_flattens_violation_lists(fake_native, seed000) -> None:
    pts = shootdown.run(seed000, sets=["variants.after.options.fake_violation=true"], quick=True)
    text = report.to_csv(pts)
    assert "INV-STALE: fake violation" in text and "[" not in text.splitlines()[-1]


def test_parquet_needs_pyarrow(monkeypatch, tmp_path) -> None:
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name == "pyarrow":
            raise ImportError("no pyarrow")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ImportError, match=r"shootdown\[parquet\]"):
        report.to_parquet(pd.DataFrame({"a": [1]}), tmp_path / "x.parquet")


def test_parquet_roundtrip(fake_native, data_home, tmp_path) -> None:
    pytest.importorskip("pyarrow")
    records = shootdown.reproduce(quick=True)  # rows mix ints (000) and strings (002)
    out = tmp_path / "r.parquet"
    report.to_parquet(records, out)
    back = pd.read_parquet(out)
    assert len(back) == len(records) and back["row"].tolist()[0] == "1"


CHECK = {
    "scenario": "lazy-switch",
    "mutant": "no-tlb-gen-check",
    "memory_model": "tso",
    "verdict": "violation",
    "invariant": "INV-STALE",
    "states": 1234,
    "transitions": 5678,
    "seconds": 0.125,
    "counterexample": [
        {"step": 1, "actor": "cpu1", "text": "switch_mm_irqs_off: set bit in mm_cpumask(mm1)"},
        {"step": 10, "actor": "cpu0", "text": "flush_tlb_mm_range: done"},
    ],
}


def test_format_check() -> None:
    lines = report.format_check(CHECK).splitlines()
    assert lines[0] == "verdict: violation (INV-STALE)"
    assert lines[1] == "scenario lazy-switch · mutant no-tlb-gen-check · memory model tso"
    assert lines[2] == "states: 1234  transitions: 5678  seconds: 0.12"
    assert lines[3] == "counterexample:"
    assert lines[4] == "   1. cpu1  switch_mm_irqs_off: set bit in mm_cpumask(mm1)"
    assert lines[5] == "  10. cpu0  flush_tlb_mm_range: done"
    noted = report.format_check({**CHECK, "notes": ["a note"]}).splitlines()
    assert noted[3] == "note: a note" and noted[4] == "counterexample:"


def test_format_check_list_and_bench() -> None:
    text = report.format_check_list(
        [
            {
                "scenario": "s",
                "description": "d",
                "mutants": [{"name": "m", "bug": "N3", "description": "x"}],
            }
        ]
    )
    assert text == "s  d\n  - m  [N3] x\n"
    text = report.format_check_list(
        [
            {
                "scenario": "s",
                "description": "d",
                "mutants": [
                    {
                        "name": "m",
                        "bug": "K1",
                        "fix": "8c6de56a42e0",
                        "cves": ["CVE-2019-3016"],
                        "description": "x",
                    }
                ],
            }
        ]
    )
    assert text == "s  d\n  - m  [K1 · CVE-2019-3016 · fix 8c6de56a42e0] x\n"
    text = report.format_check_list(
        [
            {
                "scenario": "s",
                "description": "d",
                "mutants": [
                    {
                        "name": "m",
                        "bug": None,
                        "description": "x",
                        "expect": "INV-STALE",
                        "memory_model": "tso",
                    }
                ],
            }
        ]
    )
    assert text == "s  d\n  - m  x (expect INV-STALE under tso)\n"
    bench = report.format_bench(
        {
            "steps": 10,
            "wall_s": 0.5,
            "sim_ns": 2e9,
            "steps_per_s": 1234567.0,
            "sim_s_per_wall_s": 4.0,
        }
    )
    assert bench.splitlines()[0] == "steps/s: 1,234,567"
    assert bench.splitlines()[1] == "simulated s per wall s: 4"


def test_plot_needs_matplotlib(monkeypatch, tmp_path) -> None:
    from shootdown import plot

    real_import = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    with pytest.raises(ImportError, match=r"shootdown\[plot\]"):
        plot.plot_experiment(pd.DataFrame(columns=list(RECORD_COLUMNS)), tmp_path / "x.png")


def test_plot_svg(fake_native, data_home, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    records = shootdown.reproduce(quick=True)
    out = shootdown.plot.plot_experiment(records, tmp_path / "r.svg")
    assert out.read_text().lstrip().startswith("<?xml")
    with pytest.raises(ValueError):
        shootdown.plot.plot_experiment(records, tmp_path / "none.svg", experiment="nope")


def test_check_text_states_per_second_and_peak_memory() -> None:
    result = {
        "scenario": "s",
        "mutant": None,
        "memory_model": "sc",
        "verdict": "verified",
        "invariant": None,
        "states": 2000,
        "transitions": 3000,
        "seconds": 2.0,
        "states_per_s": 1000.0,
        "peak_rss_mb": 12.4,
        "counterexample": [],
        "setup": [],
        "notes": [],
    }
    line = report.format_check(result).splitlines()[2]
    assert line.endswith("seconds: 2.00  states/s: 1,000  peak memory: 12 MB")
    del result["states_per_s"], result["peak_rss_mb"]  # a result from an older version
    assert report.format_check(result).splitlines()[2].endswith("seconds: 2.00")
