"""Where the simulated CPU time goes, per kernel function: the data behind ``shootdown profile``.

A profile run is an ordinary run of one point with its trace events folded, as they happen, into
per-function totals (the Rust side, ``shootdown_engine::profile``): the *exclusive* time of a
function is CPU time with it innermost on a CPU's stack, its *inclusive* time counts every
moment it is on the stack (an IPI handler that interrupts a flush waiting for its own IPIs is
inside both). Each CPU's timeline has a bottom slice for the task it runs, ``user`` (exclusive:
user-mode time) or ``idle`` (exclusive: idle time, which a real profile would not count as
work), so every CPU moment is somewhere. Only the measured window counts (the metric's warm-up
is left out).

Normalised per workload event (one sysbench request, one benchmark iteration…), the totals of
two variants compare directly: their difference per function says which kernel paths a patch
made cheaper or dearer, and by how much of the per-event time — the question a kernel developer
asks of a benchmark table.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import pandas as pd

from .schema import Plan

__all__ = [
    "IDLE",
    "OUTSIDE",
    "TOTAL",
    "profile_frame",
    "summarize_profile",
    "format_profile",
]

#: The bottom slice of an idle CPU.
IDLE = "idle"
#: Pseudo-function: CPU time with no slice open (a CPU before its first step).
OUTSIDE = "(no slice)"
#: Pseudo-function: all CPU time (CPUs × measured window).
TOTAL = "total (CPUs × window)"

_LONG_COLUMNS = [
    "row",
    "variant",
    "label",
    "rep",
    "value",
    "events",
    "function",
    "calls",
    "exclusive_ns",
    "inclusive_ns",
]


def profile_frame(the_plan: Plan, results: Sequence[Dict[str, Any]]) -> pd.DataFrame:
    """One row per (run, function) from the native ``profile_points`` answer.

    Each run also gets an :data:`OUTSIDE` row and a :data:`TOTAL` row, so that per variant the
    exclusive times of all functions plus :data:`OUTSIDE` add up to :data:`TOTAL`.
    """
    labels = {v["name"]: v.get("label", v["name"]) for v in the_plan["variants"]}
    rows: List[Dict[str, Any]] = []
    for r in results:
        base = {
            "row": r["row"],
            "variant": r["variant"],
            "label": labels.get(r["variant"], r["variant"]),
            "rep": int(r["rep"]),
            "value": r["value"],
            "events": int(r["events"]),
        }
        for f in r["functions"]:
            rows.append(
                {
                    **base,
                    "function": f["function"],
                    "calls": int(f["calls"]),
                    "exclusive_ns": float(f["exclusive_ns"]),
                    "inclusive_ns": float(f["inclusive_ns"]),
                }
            )
        for name, ns in ((OUTSIDE, r["outside_ns"]), (TOTAL, r["total_ns"])):
            rows.append(
                {
                    **base,
                    "function": name,
                    "calls": 0,
                    "exclusive_ns": float(ns),
                    "inclusive_ns": float(ns),
                }
            )
    frame = pd.DataFrame(rows, columns=_LONG_COLUMNS)
    frame.attrs["plan"] = the_plan
    return frame


def summarize_profile(frame: pd.DataFrame, baseline: Optional[str] = None) -> pd.DataFrame:
    """Per function and variant, over all repetitions: calls and exclusive ns per event,
    inclusive ns per call; and, for each other variant, the change of exclusive ns per event
    from the baseline.

    Columns: ``function``, then per variant ``V`` ``V:calls/event``, ``V:ns/event``,
    ``V:ns/call`` (inclusive), then ``Δ V:ns/event`` for each non-baseline ``V``. Rows are
    sorted by the largest absolute change (functions first, then :data:`IDLE`, :data:`OUTSIDE` and
    :data:`TOTAL`, whose per-event change mostly mirrors the change in throughput). A
    pseudo-function that is zero everywhere is left out.
    """
    if frame.empty:
        return pd.DataFrame(columns=["function"])
    variants = list(dict.fromkeys(frame["variant"]))
    baseline = baseline or variants[0]
    events = frame.drop_duplicates(["variant", "rep"]).groupby("variant")["events"].sum()
    sums = frame.groupby(["variant", "function"])[["calls", "exclusive_ns", "inclusive_ns"]].sum()
    out = pd.DataFrame(index=sorted(set(frame["function"])))
    for v in variants:
        n = float(events[v]) or float("nan")
        part = sums.loc[v].reindex(out.index)  # a function a variant never ran: NaN, then 0
        out[f"{v}:calls/event"] = (part["calls"] / n).fillna(0.0)
        out[f"{v}:ns/event"] = (part["exclusive_ns"] / n).fillna(0.0)
        out[f"{v}:ns/call"] = part["inclusive_ns"] / part["calls"].where(part["calls"] > 0)
    for v in variants:
        if v != baseline:
            out[f"Δ {v}:ns/event"] = out[f"{v}:ns/event"] - out[f"{baseline}:ns/event"]
    deltas = [c for c in out.columns if c.startswith("Δ ")]
    key = out[deltas].abs().max(axis=1) if deltas else out[f"{baseline}:ns/event"]
    tail = [IDLE, OUTSIDE, TOTAL]
    pseudo = out.index.isin(tail)
    order = list(key[~pseudo].sort_values(ascending=False, kind="stable").index)
    ns_cols = [f"{v}:ns/event" for v in variants]
    order += [
        p for p in tail if p in out.index and (p != OUTSIDE or out.loc[p, ns_cols].abs().sum() > 0)
    ]
    out = out.loc[order]
    out.index.name = "function"
    out = out.reset_index()
    out.attrs["variants"] = variants
    out.attrs["baseline"] = baseline
    out.attrs["events"] = {v: int(events.get(v, 0)) for v in variants}
    return out


def _num(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:,.{digits}f}"


def format_profile(summary: pd.DataFrame, title: str = "", top: Optional[int] = None) -> str:
    """A text table of :func:`summarize_profile`: per variant calls/event, ns/event (exclusive)
    and ns/call (inclusive), then the change in ns/event of each variant from the baseline."""
    variants: List[str] = summary.attrs.get("variants", [])
    baseline = summary.attrs.get("baseline")
    events = summary.attrs.get("events", {})
    body = summary
    if top is not None:
        pseudo = body["function"].isin([IDLE, OUTSIDE, TOTAL])
        body = pd.concat([body[~pseudo].head(top), body[pseudo]])
    header = ["function"]
    for v in variants:
        header += [f"{v} calls/ev", f"{v} ns/ev", f"{v} ns/call"]
    header += [f"Δ {v} ns/ev" for v in variants if v != baseline]
    rows = []
    for _, r in body.iterrows():
        line = [str(r["function"])]
        no_calls = r["function"] in (OUTSIDE, TOTAL)
        for v in variants:
            line += [
                "-" if no_calls else _num(r[f"{v}:calls/event"], 3),
                _num(r[f"{v}:ns/event"]),
                _num(r[f"{v}:ns/call"]),
            ]
        for v in variants:
            if v != baseline:
                d = r[f"Δ {v}:ns/event"]
                line.append(("+" if d > 0 else "") + _num(d))
        rows.append(line)
    widths = [max([len(h)] + [len(x[i]) for x in rows]) for i, h in enumerate(header)]

    def fmt_row(cells: List[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    lines = []
    if title:
        lines.append(title)
        lines.append("")
    lines.append(fmt_row(header))
    lines.append(fmt_row(["-" * w for w in widths]))
    lines += [fmt_row(r) for r in rows]
    lines.append("")
    lines.append(
        "ns/ev: CPU time per workload event with the function innermost (exclusive); "
        "ns/call: inclusive time per call; events: "
        + ", ".join(f"{v} {events.get(v, 0):,}" for v in variants)
    )
    return "\n".join(lines) + "\n"
