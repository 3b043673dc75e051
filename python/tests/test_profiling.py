"""``shootdown.profiling``: per-event profiles and the change between variants (pure Python)."""

from __future__ import annotations

import math

from shootdown import profiling


def _plan():
    return {
        "variants": [
            {"name": "before", "label": "old"},
            {"name": "after", "label": "new"},
        ]
    }


def _run(variant, rep, events, functions, outside=0.0):
    total = sum(f[2] for f in functions) + outside
    return {
        "row": 4,
        "variant": variant,
        "rep": rep,
        "value": 1.0,
        "events": events,
        "total_ns": total,
        "outside_ns": outside,
        "functions": [
            {"function": n, "calls": c, "exclusive_ns": e, "inclusive_ns": i}
            for n, c, e, i in functions
        ],
    }


def test_summary_is_per_event_over_all_reps_and_sorted_by_change() -> None:
    results = [
        _run("before", 0, 10, [("flush", 20, 1000.0, 3000.0), ("user", 0, 500.0, 5000.0)]),
        _run("before", 1, 30, [("flush", 60, 3000.0, 9000.0), ("user", 0, 1500.0, 9000.0)]),
        _run(
            "after",
            0,
            40,
            [("flush", 80, 2000.0, 4000.0), ("user", 0, 2000.0, 9000.0), ("idle", 0, 800.0, 800.0)],
        ),
    ]
    frame = profiling.profile_frame(_plan(), results)
    assert set(frame["label"]) == {"old", "new"}
    s = profiling.summarize_profile(frame).set_index("function")
    # before: 4000 ns of flush over 40 events; after: 2000 over 40.
    assert s.loc["flush", "before:ns/event"] == 100.0
    assert s.loc["flush", "after:ns/event"] == 50.0
    assert s.loc["flush", "Δ after:ns/event"] == -50.0
    assert s.loc["flush", "before:calls/event"] == 2.0
    assert s.loc["flush", "before:ns/call"] == 150.0  # inclusive 12000 over 80 calls
    assert math.isnan(s.loc["user", "before:ns/call"])  # no calls counted
    assert s.loc["idle", "before:ns/event"] == 0.0  # absent in one variant: zero
    # Functions by |change| first; idle and the total last; the empty "(no slice)" dropped.
    assert list(s.index) == ["flush", "user", "idle", profiling.TOTAL]


def test_format_profile_shows_variants_changes_and_event_counts() -> None:
    results = [
        _run("before", 0, 10, [("flush_tlb_func", 5, 90.0, 90.0), ("user", 0, 10.0, 10.0)], 5.0),
        _run("after", 0, 10, [("flush_tlb_func", 4, 40.0, 40.0), ("user", 0, 10.0, 10.0)], 5.0),
    ]
    summary = profiling.summarize_profile(profiling.profile_frame(_plan(), results))
    text = profiling.format_profile(summary, "title", top=1)
    lines = text.splitlines()
    assert lines[0] == "title"
    assert lines[2].split()[:2] == ["function", "before"]
    row = lines[4].split()
    assert row[0] == "flush_tlb_func" and row[-1] == "-5"  # 9 -> 4 ns/event
    assert not any(line.startswith("user") for line in lines)  # cut by top=1
    assert lines[5].startswith(profiling.OUTSIDE) and lines[6].startswith(profiling.TOTAL)
    assert lines[-1].endswith("events: before 10, after 10")


def test_empty_frame() -> None:
    frame = profiling.profile_frame(_plan(), [])
    assert profiling.summarize_profile(frame).empty
