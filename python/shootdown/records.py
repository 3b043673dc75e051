"""From native point results to tables: per-point frames, summaries and comparison records.

Three levels of table, all ``pandas.DataFrame``:

* **points** (:func:`points_frame`, what :func:`shootdown.run` returns): one row per simulated
  run — ``index, row, variant, label, rep, rng_seed, value, sim_ns, steps, wall_s``, one
  ``c.<name>`` column per kernel-style counter (``c.nr_tlb_remote_flush`` …) and
  ``violations`` (a list of invariant-violation messages, normally empty), then the
  provenance columns :data:`POINT_PROVENANCE_COLUMNS` (the same value on every row of a
  plan: see :mod:`shootdown.provenance`).
* **summary** (:func:`summarize`): one row per (row, variant): ``n, avg, stdev`` (sample
  standard deviation, ddof=1; missing when n < 2), the published ``value``/``stdev`` when the
  experiment has them, and for non-baseline variants the change in % against the baseline
  variant of the same row, simulated and published.
* **records** (:func:`build_records`, what :func:`shootdown.reproduce` returns): the summary plus
  the experiment's identity and the *direction* verdicts; columns :data:`RECORD_COLUMNS`.

Every records and points frame carries its provenance (:mod:`shootdown.provenance`): the
experiment file, profile, ``--set`` overrides, ``quick``, repetitions, base RNG seed, model
version, a digest of the files read, and ``modified``. A *modified* run (``--set`` changed the
configuration, not just which rows or repetitions run) is not compared with the published
numbers: its ``direction_ok`` is ``None``.

Missing numbers are ``NaN`` in the frames and ``null``/``None`` once converted with
:func:`to_dicts` (the JSON output). Text columns that may be missing (``seed``, ``direction``,
``published_direction``, ``direction_ok``) hold ``None``.

Direction rule
--------------
For a non-baseline variant, ``change_pct = (avg - baseline_avg) / |baseline_avg| × 100`` and the
*noise* of that side is ``sqrt(s_baseline² + s_variant²) / |baseline_avg| × 100`` using that
side's standard deviations (simulated stdevs for the simulated side, published stdevs for the
published side), but never less than :data:`FLAT_THRESHOLD_PCT` (0.5 %): a smaller change is no
direction even when a side is deterministic (stdev 0). When either stdev is unknown (a single
repetition, or a paper that gave no stdev) the noise is that floor. The direction is ``"flat"``
when ``|change_pct| <= noise``, else ``"up"`` or ``"down"`` by the sign of the change.
``direction_ok`` is ``direction == published_direction``; it is ``None`` for baseline rows,
where either side has no change (no published numbers, or a zero baseline), and for every
record of a modified run (the published numbers belong to another configuration).
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .provenance import PROVENANCE_COLUMNS, plan_provenance
from .schema import Plan, PointResult

__all__ = [
    "COUNTER_PREFIX",
    "FLAT_THRESHOLD_PCT",
    "POINT_COLUMNS",
    "POINT_PROVENANCE_COLUMNS",
    "SUMMARY_COLUMNS",
    "RECORD_COLUMNS",
    "FLOAT_RECORD_COLUMNS",
    "row_key",
    "is_missing",
    "points_frame",
    "constant_column",
    "summarize",
    "change_pct",
    "noise_pct",
    "direction",
    "in_band",
    "BAND_PP",
    "BAND_REL",
    "build_records",
    "empty_records",
    "concat_records",
    "to_dicts",
    "to_json",
]

#: Prefix of the counter columns in a points frame.
COUNTER_PREFIX = "c."

#: Smallest change (in %) that counts as a direction; also the noise assumed when a side's
#: standard deviations are unknown.
FLAT_THRESHOLD_PCT = 0.5

#: A simulated change is *in band* when it lies within ``max(BAND_PP, BAND_REL × |published
#: change|)`` percentage points of the published change: 2 pp for small changes, 25 % of the
#: change for large ones.
BAND_PP = 2.0
BAND_REL = 0.25

#: Fixed columns of a points frame (counter columns ``c.*`` sit between ``wall_s`` and
#: ``violations``).
POINT_COLUMNS: Tuple[str, ...] = (
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
    "violations",
)

#: Provenance columns at the end of a points frame (after ``violations``), the same on every
#: row of a plan: ``experiment`` name · ``experiment_path`` · ``profile`` · ``sets`` · ``quick``
#: · ``repetitions`` · ``base_rng_seed`` the experiment's base seed (a points frame's own
#: ``rng_seed`` is each run's seed, mixed from it) · ``version`` · ``inputs_sha256`` ·
#: ``modified``; see :data:`RECORD_COLUMNS` and :mod:`shootdown.provenance`.
POINT_PROVENANCE_COLUMNS: Tuple[str, ...] = (
    "experiment",
    "experiment_path",
    "profile",
    "sets",
    "quick",
    "repetitions",
    "base_rng_seed",
    "version",
    "inputs_sha256",
    "modified",
)

#: Columns of :func:`summarize`'s frame.
SUMMARY_COLUMNS: Tuple[str, ...] = (
    "row",
    "variant",
    "label",
    "baseline",
    "n",
    "avg",
    "stdev",
    "published",
    "published_stdev",
    "change_pct",
    "published_change_pct",
    "violations",
    "fitted",
    "counters",
    "published_counters",
)

#: Columns of a records frame, in order.
#:
#: ``seed`` seed id ("000") or None · ``experiment`` experiment name · ``title`` · ``profile``
#: · ``metric`` · ``unit`` · ``row_key`` name of the swept key · ``higher_is_better`` ·
#: ``row`` row value · ``variant`` · ``label`` · ``baseline`` (bool) · ``n`` repetitions run ·
#: ``simulated`` mean · ``stdev`` sample stdev · ``published`` / ``published_stdev`` ·
#: ``change_pct`` / ``published_change_pct`` vs the baseline variant · ``noise_pct`` /
#: ``published_noise_pct`` the flat threshold used · ``direction`` / ``published_direction``
#: "up" | "down" | "flat" | None · ``direction_ok`` bool | None · ``in_band`` bool | None: the
#: simulated change within :func:`in_band`'s band of the published one (None where
#: ``direction_ok`` is) · ``change_fitted`` bool | None: this cell or its row's baseline cell
#: was fitted on, so the change is not a prediction (None for baselines) · ``violations`` number
#: of invariant violations seen in the simulated runs · ``fitted`` the profile's cost keys
#: fitted on this published cell, comma-separated ("" for a prediction).
#:
#: Provenance (:mod:`shootdown.provenance`; appended last so positional consumers keep
#: working): ``experiment_path`` the experiment file read · ``sets`` the ``--set KEY=VALUE``
#: overrides in order, joined with "; " ("" for none) · ``quick`` bool (None if unknown) ·
#: ``repetitions`` per (row, variant) as planned · ``rng_seed`` the experiment's base RNG seed
#: (None if unknown) · ``version`` package version + model digest
#: (``0.1.0+native.<sha16>``) · ``inputs_sha256`` 16 hex digits over the SHA-256 of every file
#: read (experiment, then its profile chain) · ``modified`` bool: the overrides changed the
#: configuration compared (anything but rows, repetitions, RNG seed and labels), so
#: ``direction_ok`` is None and the published numbers are the unmodified configuration's.
#:
#: Reported counters (before the provenance): ``layout`` how tables lay the experiment out
#: ("rows" or "variants_as_rows") · ``builds_on`` the variant this one adds patches to, or None
#: · ``counters`` / ``published_counters`` the experiment's reported counters (seed 004's "zap
#: cnt"), simulated mean and published value, as JSON objects keyed by the counter's label
#: (``{"zap cnt": 84.0}``; "{}" when the experiment reports none).
RECORD_COLUMNS: Tuple[str, ...] = (
    "seed",
    "experiment",
    "title",
    "profile",
    "metric",
    "unit",
    "row_key",
    "higher_is_better",
    "row",
    "variant",
    "label",
    "baseline",
    "n",
    "simulated",
    "stdev",
    "published",
    "published_stdev",
    "change_pct",
    "published_change_pct",
    "noise_pct",
    "published_noise_pct",
    "direction",
    "published_direction",
    "direction_ok",
    "in_band",
    "change_fitted",
    "violations",
    "fitted",
    "layout",
    "builds_on",
    "counters",
    "published_counters",
    # provenance, "profile" being already above
    *(c for c in PROVENANCE_COLUMNS if c != "profile"),
)

#: The records' float columns (NaN when missing).
FLOAT_RECORD_COLUMNS: Tuple[str, ...] = (
    "simulated",
    "stdev",
    "published",
    "published_stdev",
    "change_pct",
    "published_change_pct",
    "noise_pct",
    "published_noise_pct",
)
_OBJECT_RECORD_COLUMNS = (
    "seed",
    "builds_on",
    "row",
    "direction",
    "published_direction",
    "direction_ok",
    "in_band",
    "change_fitted",
    "experiment_path",
    "quick",
    "inputs_sha256",
)
#: Integer columns that may be missing: pandas' nullable ``Int64``.
_NULLABLE_INT_RECORD_COLUMNS = ("repetitions", "rng_seed")


# --------------------------------------------------------------------------- small helpers


def _py(value: Any) -> Any:
    """A plain Python value for a numpy/pandas scalar (``pd.NA``/``NaN`` become ``None``)."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def is_missing(value: Any) -> bool:
    """True for ``None``, ``NaN`` and ``pd.NA`` (scalars only)."""
    return _py(value) is None


def _num(value: Any) -> float:
    """A float, with ``None``/``NA`` mapped to ``NaN``."""
    value = _py(value)
    return math.nan if value is None else float(value)


def row_key(value: Any) -> Hashable:
    """A hashable key under which equal rows compare equal (``8``, ``8.0`` and ``np.int64(8)``)."""
    value = _py(value)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        number = float(value)
        if number.is_integer():
            return ("n", int(number))
        return ("n", number)
    return ("s", str(value))


def _frame_rows(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    """Rows of a frame as dicts keyed by column name (values unconverted)."""
    cols = [str(c) for c in frame.columns]
    return [dict(zip(cols, row)) for row in frame.itertuples(index=False, name=None)]


# --------------------------------------------------------------------------- points


def points_frame(plan: Plan, results: Sequence[PointResult]) -> pd.DataFrame:
    """One row per point result, in index order; ``attrs["plan"]`` keeps the plan.

    Counters become ``c.<name>`` columns (``NaN`` where a point did not report one).
    """
    labels = {v["name"]: v["label"] for v in plan["variants"]}
    seeds = {p["index"]: p.get("seed") for p in plan["points"]}
    counter_names = sorted({name for r in results for name in r.get("counters", {})})
    rows: List[Dict[str, Any]] = []
    for r in sorted(results, key=lambda r: r["index"]):
        row: Dict[str, Any] = {
            "index": r["index"],
            "row": r["row"],
            "variant": r["variant"],
            "label": labels.get(r["variant"], r["variant"]),
            "rep": r["rep"],
            "rng_seed": seeds.get(r["index"]),
            "value": _num(r.get("value")),
            "sim_ns": _num(r.get("sim_ns")),
            "steps": r.get("steps"),
            "wall_s": _num(r.get("wall_s")),
        }
        counters = r.get("counters", {})
        for name in counter_names:
            row[COUNTER_PREFIX + name] = _num(counters.get(name))
        row["violations"] = list(r.get("violations", []))
        rows.append(row)
    columns = (
        list(POINT_COLUMNS[:-1]) + [COUNTER_PREFIX + n for n in counter_names] + ["violations"]
    )
    frame = pd.DataFrame(rows, columns=columns)
    frame["row"] = pd.Series([r["row"] for r in rows], dtype=object, index=frame.index)
    frame["violations"] = pd.Series(
        [r["violations"] for r in rows], dtype=object, index=frame.index
    )
    prov = plan_provenance(plan)
    prov["base_rng_seed"] = prov.pop("rng_seed")
    prov["experiment"] = plan["experiment"]["name"]
    for col in POINT_PROVENANCE_COLUMNS:
        frame[col] = constant_column(prov[col], len(frame), frame.index)
    frame.attrs["plan"] = plan
    return frame


def constant_column(value: Any, n: int, index: pd.Index) -> pd.Series:
    """A column holding ``value`` on every row, typed like the records' column of that kind
    (nullable ``Int64`` for integers, ``object`` when the value is missing)."""
    if isinstance(value, bool):
        return pd.Series([value] * n, dtype=bool, index=index)
    if isinstance(value, int):
        return pd.Series([value] * n, dtype="Int64", index=index)
    return pd.Series([value] * n, dtype=object, index=index)


# --------------------------------------------------------------------------- statistics


def change_pct(value: Any, baseline: Any) -> float:
    """``(value - baseline) / |baseline| × 100``; ``NaN`` if either is missing or baseline is 0."""
    v, b = _num(value), _num(baseline)
    if math.isnan(v) or math.isnan(b) or b == 0:
        return math.nan
    return (v - b) / abs(b) * 100.0


def noise_pct(baseline_avg: Any, baseline_stdev: Any, variant_stdev: Any) -> float:
    """Combined relative noise of one side, in % of the baseline average.

    ``max(sqrt(sb² + sv²) / |baseline_avg| × 100, FLAT_THRESHOLD_PCT)``, or
    :data:`FLAT_THRESHOLD_PCT` when either stdev is unknown. ``NaN`` if the baseline average is
    missing or zero.
    """
    b = _num(baseline_avg)
    if math.isnan(b) or b == 0:
        return math.nan
    sb, sv = _num(baseline_stdev), _num(variant_stdev)
    if math.isnan(sb) or math.isnan(sv):
        return FLAT_THRESHOLD_PCT
    return max(math.hypot(sb, sv) / abs(b) * 100.0, FLAT_THRESHOLD_PCT)


def direction(change: Any, noise: Any) -> Optional[str]:
    """``"flat"`` if ``|change| <= noise``, else ``"up"``/``"down"``; ``None`` if unknown."""
    c, n = _num(change), _num(noise)
    if math.isnan(c) or math.isnan(n):
        return None
    if abs(c) <= n:
        return "flat"
    return "up" if c > 0 else "down"


def in_band(change: Any, published_change: Any) -> Optional[bool]:
    """Whether ``change`` lies within ``max(BAND_PP, BAND_REL × |published_change|)`` of
    ``published_change`` (percentage points); ``None`` if either is unknown."""
    c, p = _num(change), _num(published_change)
    if math.isnan(c) or math.isnan(p):
        return None
    return abs(c - p) <= max(BAND_PP, BAND_REL * abs(p))


def _stats(values: Iterable[float]) -> Tuple[int, float, float]:
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return 0, math.nan, math.nan
    avg = statistics.fmean(vals)
    sd = statistics.stdev(vals) if n >= 2 else math.nan
    return n, avg, sd


def summarize(points: pd.DataFrame, plan: Optional[Plan] = None) -> pd.DataFrame:
    """Per (row, variant) statistics of a points frame; columns :data:`SUMMARY_COLUMNS`.

    Args:
        points: a frame from :func:`shootdown.run` (or :func:`points_frame`).
        plan: the experiment's plan; defaults to ``points.attrs["plan"]``.

    Rows come in the plan's order (rows × variants). ``stdev`` is the sample standard
    deviation (ddof=1), ``NaN`` when n < 2. ``change_pct``/``published_change_pct`` compare each
    non-baseline variant with the baseline (first) variant of the same row.
    """
    if plan is None:
        plan = points.attrs.get("plan")
    if plan is None:
        raise ValueError("summarize() needs the plan (pass it, or use a frame from shootdown.run)")

    variants = plan["variants"]
    baseline_name = variants[0]["name"]
    published = {(row_key(c["row"]), c["variant"]): c for c in plan["published"]}

    values: Dict[Tuple[Hashable, str], List[float]] = {}
    violations: Dict[Tuple[Hashable, str], int] = {}
    reported = plan["experiment"].get("counters") or []
    label_of = {c["counter"]: c.get("label") or c["counter"] for c in reported}
    counter_values: Dict[Tuple[Hashable, str], Dict[str, List[float]]] = {}
    for name, label in label_of.items():
        col = COUNTER_PREFIX + name
        if col not in points:
            continue
        for row, variant, value in zip(points["row"], points["variant"], points[col]):
            key = (row_key(row), str(variant))
            counter_values.setdefault(key, {}).setdefault(label, []).append(float(value))
    if len(points):
        viol_col: Any = points["violations"] if "violations" in points else [[]] * len(points)
        for row, variant, value, viol in zip(
            points["row"], points["variant"], points["value"], viol_col
        ):
            key = (row_key(row), str(variant))
            values.setdefault(key, []).append(float(value))
            violations[key] = violations.get(key, 0) + (
                len(viol) if isinstance(viol, (list, tuple, np.ndarray)) else 0
            )

    out: List[Dict[str, Any]] = []
    for row in plan["rows"]:
        rk = row_key(row)
        _, base_avg, _ = _stats(values.get((rk, baseline_name), []))
        base_cell = published.get((rk, baseline_name))
        base_pub = _num(base_cell["value"]) if base_cell else math.nan
        for v in variants:
            key = (rk, v["name"])
            n, avg, sd = _stats(values.get(key, []))
            cell = published.get(key)
            pub = _num(cell["value"]) if cell else math.nan
            pub_sd = _num(cell.get("stdev")) if cell else math.nan
            is_base = v["name"] == baseline_name
            out.append(
                {
                    "row": row,
                    "variant": v["name"],
                    "label": v["label"],
                    "baseline": is_base,
                    "n": n,
                    "avg": avg,
                    "stdev": sd,
                    "published": pub,
                    "published_stdev": pub_sd,
                    "change_pct": math.nan if is_base else change_pct(avg, base_avg),
                    "published_change_pct": math.nan if is_base else change_pct(pub, base_pub),
                    "violations": violations.get(key, 0),
                    "fitted": ",".join(cell.get("fitted") or []) if cell else "",
                    "counters": json.dumps(
                        {k: statistics.fmean(v) for k, v in counter_values.get(key, {}).items()},
                        sort_keys=True,
                    ),
                    "published_counters": json.dumps(
                        {
                            label_of.get(k, k): v
                            for k, v in ((cell.get("counters") or {}) if cell else {}).items()
                        },
                        sort_keys=True,
                    ),
                }
            )
    frame = pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))
    frame["row"] = pd.Series([o["row"] for o in out], dtype=object, index=frame.index)
    for col in (
        "avg",
        "stdev",
        "published",
        "published_stdev",
        "change_pct",
        "published_change_pct",
    ):
        frame[col] = frame[col].astype(float)
    frame.attrs["plan"] = plan
    return frame


# --------------------------------------------------------------------------- records


def build_records(plan: Plan, summary: pd.DataFrame) -> pd.DataFrame:
    """Comparison records of one experiment (columns :data:`RECORD_COLUMNS`)."""
    exp = plan["experiment"]
    prov = plan_provenance(plan)
    modified = bool(prov["modified"])
    summary_rows = _frame_rows(summary)
    base_by_row: Dict[Hashable, Dict[str, Any]] = {}
    for rec in summary_rows:
        if rec["baseline"]:
            base_by_row[row_key(rec["row"])] = rec

    builds_on = {v["name"]: v.get("builds_on") for v in plan["variants"]}
    out: List[Dict[str, Any]] = []
    for rec in summary_rows:
        base = base_by_row.get(row_key(rec["row"]))
        is_base = bool(rec["baseline"])
        if is_base or base is None:
            noise = pub_noise = math.nan
            sim_dir = pub_dir = None
        else:
            noise = noise_pct(base["avg"], base["stdev"], rec["stdev"])
            pub_noise = noise_pct(
                base["published"], base["published_stdev"], rec["published_stdev"]
            )
            sim_dir = direction(rec["change_pct"], noise)
            pub_dir = direction(rec["published_change_pct"], pub_noise)
        ok = None if (modified or sim_dir is None or pub_dir is None) else sim_dir == pub_dir
        band = None if ok is None else in_band(rec["change_pct"], rec["published_change_pct"])
        fitted_change = (
            None if is_base or base is None else bool(rec.get("fitted") or base.get("fitted"))
        )
        out.append(
            {
                "seed": exp.get("seed"),
                "experiment": exp["name"],
                "title": exp.get("title", ""),
                "profile": exp.get("profile", ""),
                "metric": exp.get("metric", ""),
                "unit": exp.get("unit", ""),
                "row_key": exp.get("row_key", "row"),
                "higher_is_better": bool(exp.get("higher_is_better", True)),
                "row": _py(rec["row"]),
                "variant": rec["variant"],
                "label": rec["label"],
                "baseline": is_base,
                "n": int(rec["n"]),
                "simulated": rec["avg"],
                "stdev": rec["stdev"],
                "published": rec["published"],
                "published_stdev": rec["published_stdev"],
                "change_pct": rec["change_pct"],
                "published_change_pct": rec["published_change_pct"],
                "noise_pct": noise,
                "published_noise_pct": pub_noise,
                "direction": sim_dir,
                "published_direction": pub_dir,
                "direction_ok": ok,
                "in_band": band,
                "change_fitted": fitted_change,
                "violations": int(rec["violations"]),
                "fitted": str(rec.get("fitted") or ""),
                **{k: v for k, v in prov.items() if k != "profile"},
                "layout": exp.get("layout") or "rows",
                "builds_on": builds_on.get(rec["variant"]),
                "counters": str(rec.get("counters") or "{}"),
                "published_counters": str(rec.get("published_counters") or "{}"),
            }
        )
    return _records_frame(out)


def _records_frame(rows: List[Dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    for col in FLOAT_RECORD_COLUMNS:
        frame[col] = frame[col].astype(float)
    for col in _OBJECT_RECORD_COLUMNS:
        frame[col] = pd.Series([r[col] for r in rows], dtype=object, index=frame.index)
    for col in _NULLABLE_INT_RECORD_COLUMNS:
        frame[col] = pd.Series([_py(r[col]) for r in rows], dtype="Int64", index=frame.index)
    frame["modified"] = pd.Series(
        [bool(_py(r["modified"])) for r in rows], dtype=bool, index=frame.index
    )
    return frame


def empty_records() -> pd.DataFrame:
    """A records frame with no rows (all :data:`RECORD_COLUMNS`)."""
    return _records_frame([])


def concat_records(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate records frames, keeping the column types (None stays None)."""
    rows: List[Dict[str, Any]] = []
    for f in frames:
        rows.extend(_frame_rows(f))
    for r in rows:
        for col in RECORD_COLUMNS:
            r.setdefault(col, None)  # records written before a column existed
        for col in _OBJECT_RECORD_COLUMNS:
            r[col] = _py(r[col])
    return _records_frame(rows)


# --------------------------------------------------------------------------- conversion


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    value = _py(value)
    if isinstance(value, float) and math.isinf(value):
        return None
    return value


def to_dicts(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    """Rows as plain Python dicts, ready for ``json.dumps``: ``NaN``/``NA`` become ``None``,
    numpy scalars become Python numbers."""
    cols = [str(c) for c in frame.columns]
    return [
        {col: _plain(val) for col, val in zip(cols, row)}
        for row in frame.itertuples(index=False, name=None)
    ]


def to_json(frame: pd.DataFrame, *, indent: Optional[int] = 2) -> str:
    """The frame as ONE JSON array of objects (strict JSON: no ``NaN``)."""
    return json.dumps(to_dicts(frame), indent=indent, ensure_ascii=False, allow_nan=False)
