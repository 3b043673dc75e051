"""Statistics, change %, the direction rule and record columns (no native module needed)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shootdown import records
from shootdown.records import (
    FLAT_THRESHOLD_PCT,
    RECORD_COLUMNS,
    build_records,
    change_pct,
    direction,
    noise_pct,
    points_frame,
    row_key,
    summarize,
    to_dicts,
)


def make_plan(
    rows: List[Any],
    published: Optional[List[Dict[str, Any]]] = None,
    reps: int = 3,
    variants=(("before", "old"), ("after", "new")),
) -> Dict[str, Any]:
    points = []
    for row in rows:
        for name, _ in variants:
            for rep in range(reps):
                points.append(
                    {
                        "index": len(points),
                        "row": row,
                        "variant": name,
                        "rep": rep,
                        "seed": len(points),
                    }
                )
    return {
        "experiment": {
            "name": "exp",
            "seed": "000",
            "title": "T",
            "profile": "p",
            "metric": "events",
            "unit": "ev",
            "row_key": "threads",
            "higher_is_better": True,
            "repetitions": reps,
        },
        "variants": [{"name": n, "label": label} for n, label in variants],
        "rows": rows,
        "published": published or [],
        "points": points,
    }


def results_for(plan: Dict[str, Any], values: Dict[tuple, List[float]]) -> List[Dict[str, Any]]:
    out = []
    for p in plan["points"]:
        v = values[(p["row"], p["variant"])][p["rep"]]
        out.append(
            {
                "index": p["index"],
                "row": p["row"],
                "variant": p["variant"],
                "rep": p["rep"],
                "value": v,
                "sim_ns": 1e6,
                "steps": 10,
                "wall_s": 0.1,
                "counters": {"nr_tlb_remote_flush": 3},
                "violations": [],
            }
        )
    return out


def test_points_frame_columns_and_counters() -> None:
    plan = make_plan([1], reps=2)
    res = results_for(plan, {(1, "before"): [1.0, 2.0], (1, "after"): [3.0, 4.0]})
    res[0]["counters"]["extra"] = 7
    res[1]["violations"] = ["INV-STALE: x"]
    df = points_frame(plan, res)
    assert list(df.columns) == [
        "index",
        "row",
        "variant",
        "label",
        "rep",
        "rng_seed",
        "value",
        "sim_ns",
        "steps",
        "wall_s",
        "c.extra",
        "c.nr_tlb_remote_flush",
        "violations",
        *records.POINT_PROVENANCE_COLUMNS,
    ]
    assert df["label"].tolist() == ["old", "old", "new", "new"]
    assert df["violations"].iloc[1] == ["INV-STALE: x"]
    assert math.isnan(df["c.extra"].iloc[1])
    assert df.attrs["plan"] is plan


def test_summarize_mean_sample_stdev_and_change() -> None:
    plan = make_plan(
        [1, 2],
        published=[
            {"row": 1, "variant": "before", "value": 100.0, "stdev": 2.0},
            {"row": 1, "variant": "after", "value": 110.0, "stdev": None},
        ],
    )
    vals = {
        (1, "before"): [100.0, 102.0, 104.0],
        (1, "after"): [110.0, 112.0, 114.0],
        (2, "before"): [200.0, 200.0, 200.0],
        (2, "after"): [190.0, 190.0, 190.0],
    }
    s = summarize(points_frame(plan, results_for(plan, vals)))
    assert list(s.columns) == list(records.SUMMARY_COLUMNS)
    r1b, r1a, r2b, r2a = s.to_dict("records")
    assert r1b["avg"] == pytest.approx(102.0)
    assert r1b["stdev"] == pytest.approx(statistics.stdev([100.0, 102.0, 104.0]))  # ddof=1
    assert r1b["n"] == 3 and r1b["baseline"] and not r1a["baseline"]
    assert math.isnan(r1b["change_pct"])
    assert r1a["change_pct"] == pytest.approx((112 - 102) / 102 * 100)
    assert r1a["published_change_pct"] == pytest.approx(10.0)
    assert r2a["change_pct"] == pytest.approx(-5.0)
    assert math.isnan(r2a["published"]) and math.isnan(r2a["published_change_pct"])
    assert r2b["stdev"] == 0.0


def test_single_repetition_stdev_is_null() -> None:
    plan = make_plan([1], reps=1)
    s = summarize(
        points_frame(plan, results_for(plan, {(1, "before"): [5.0], (1, "after"): [6.0]}))
    )
    assert math.isnan(s["stdev"].iloc[0])
    recs = to_dicts(build_records(plan, s))
    assert recs[0]["stdev"] is None and recs[0]["published"] is None
    # unknown stdevs: the flat threshold is 0.5 %
    assert recs[1]["noise_pct"] == FLAT_THRESHOLD_PCT
    assert recs[1]["direction"] == "up"


def test_summarize_accepts_numpy_and_float_rows() -> None:
    plan = make_plan([8], reps=2)
    df = points_frame(
        plan, results_for(plan, {(8, "before"): [1.0, 1.0], (8, "after"): [2.0, 2.0]})
    )
    df["row"] = df["row"].astype("int64").astype(float)  # 8.0 must still match row 8
    s = summarize(df, plan)
    assert s["n"].tolist() == [2, 2]
    assert row_key(8) == row_key(8.0) and row_key("8") != row_key(8)


def test_summarize_needs_plan() -> None:
    import pandas as pd

    with pytest.raises(ValueError):
        summarize(pd.DataFrame({"row": [], "variant": [], "value": []}))


def test_record_columns_and_directions() -> None:
    plan = make_plan(
        [1, 2, 4],
        published=[
            {"row": 1, "variant": "before", "value": 100.0, "stdev": 1.0},
            {"row": 1, "variant": "after", "value": 110.0, "stdev": 1.0},
            {"row": 2, "variant": "before", "value": 100.0, "stdev": 1.0},
            {"row": 2, "variant": "after", "value": 100.5, "stdev": 1.0},
        ],
    )
    vals = {
        (1, "before"): [100.0, 101.0, 99.0],
        (1, "after"): [120.0, 121.0, 119.0],  # up, published up -> ok
        (2, "before"): [100.0, 101.0, 99.0],
        (2, "after"): [80.0, 81.0, 79.0],  # down, published flat -> mismatch
        (4, "before"): [1.0, 1.0, 1.0],
        (4, "after"): [1.0, 1.0, 1.0],  # no published numbers
    }
    recs_df = build_records(plan, summarize(points_frame(plan, results_for(plan, vals))))
    assert tuple(recs_df.columns) == RECORD_COLUMNS
    recs = to_dicts(recs_df)
    assert all(set(r) == set(RECORD_COLUMNS) for r in recs)
    by = {(r["row"], r["variant"]): r for r in recs}
    assert by[(1, "before")]["direction"] is None and by[(1, "before")]["direction_ok"] is None
    assert by[(1, "after")]["direction"] == "up" and by[(1, "after")]["published_direction"] == "up"
    assert by[(1, "after")]["direction_ok"] is True
    assert (
        by[(2, "after")]["direction"] == "down"
        and by[(2, "after")]["published_direction"] == "flat"
    )
    assert by[(2, "after")]["direction_ok"] is False
    assert by[(4, "after")]["direction"] == "flat"
    assert (
        by[(4, "after")]["published_direction"] is None and by[(4, "after")]["direction_ok"] is None
    )
    assert by[(1, "after")]["seed"] == "000" and by[(1, "after")]["label"] == "new"
    # strict JSON: no NaN anywhere
    import json

    json.loads(records.to_json(recs_df))


def test_seed_none_stays_none() -> None:
    plan = make_plan([1], reps=2)
    plan["experiment"]["seed"] = None
    recs = build_records(
        plan,
        summarize(
            points_frame(plan, results_for(plan, {(1, "before"): [1, 2], (1, "after"): [1, 2]}))
        ),
    )
    assert recs["seed"].tolist() == [None, None]
    assert records.concat_records([recs, recs])["seed"].tolist() == [None] * 4


def test_change_and_noise_edge_cases() -> None:
    assert math.isnan(change_pct(1.0, 0.0))
    assert math.isnan(change_pct(None, 1.0))
    assert change_pct(-90.0, -100.0) == pytest.approx(10.0)
    assert noise_pct(100.0, 3.0, 4.0) == pytest.approx(5.0)
    # Deterministic sides still need a change of at least the floor to have a direction.
    assert noise_pct(100.0, 0.0, 0.0) == FLAT_THRESHOLD_PCT
    assert direction(change_pct(100.1, 100.0), noise_pct(100.0, 0.0, 0.0)) == "flat"
    assert noise_pct(100.0, None, 4.0) == FLAT_THRESHOLD_PCT
    assert noise_pct(100.0, float("nan"), float("nan")) == FLAT_THRESHOLD_PCT
    assert math.isnan(noise_pct(0.0, 1.0, 1.0))
    assert direction(float("nan"), 1.0) is None
    assert direction(0.0, 0.0) == "flat"
    assert direction(-0.6, 0.5) == "down"


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(change=finite, noise=nonneg)
def test_direction_is_flat_iff_within_noise(change: float, noise: float) -> None:
    d = direction(change, noise)
    assert (d == "flat") == (abs(change) <= noise)
    if d != "flat":
        assert d == ("up" if change > 0 else "down")


positive = st.floats(min_value=1.0, max_value=1e7, allow_nan=False, allow_infinity=False)
rel = st.floats(min_value=-0.5, max_value=0.5, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    base=positive,
    shift=rel,
    spread_b=st.lists(st.floats(min_value=-0.05, max_value=0.05), min_size=1, max_size=5),
    spread_v=st.lists(st.floats(min_value=-0.05, max_value=0.05), min_size=1, max_size=5),
)
def test_record_direction_matches_the_documented_rule(
    base: float, shift: float, spread_b: List[float], spread_v: List[float]
) -> None:
    reps = min(len(spread_b), len(spread_v))
    vb = [base * (1 + e) for e in spread_b[:reps]]
    vv = [base * (1 + shift) * (1 + e) for e in spread_v[:reps]]
    plan = make_plan([1], reps=reps)
    rec = to_dicts(
        build_records(
            plan,
            summarize(points_frame(plan, results_for(plan, {(1, "before"): vb, (1, "after"): vv}))),
        )
    )[1]
    mb, mv = statistics.fmean(vb), statistics.fmean(vv)
    delta = (mv - mb) / mb * 100
    if reps >= 2:
        threshold = max(
            math.sqrt(statistics.stdev(vb) ** 2 + statistics.stdev(vv) ** 2) / mb * 100,
            FLAT_THRESHOLD_PCT,
        )
    else:
        threshold = FLAT_THRESHOLD_PCT
    assume(abs(abs(delta) - threshold) > 1e-9 * max(1.0, threshold))  # not on the boundary
    expected = "flat" if abs(delta) <= threshold else ("up" if delta > 0 else "down")
    assert rec["direction"] == expected
    assert rec["change_pct"] == pytest.approx(delta, rel=1e-9, abs=1e-9)
