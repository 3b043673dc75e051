"""Human-readable and file outputs: seed-style tables, CSV, Parquet, checker and bench text.

:func:`format_table` prints records the way the seeds' cover letters print their results::

    seed 000 · sysbench fileio rndwr, mmap on DAX · events/10s

    threads  tip-jun28 avg (stdev)  +patch-set avg (stdev)  change  pub tip-jun28 ...  dir
    -------  ---------------------  ----------------------  ------  ------------- ...  ---
    1        1267765 (14146)        1299253 (5715)          +2.5%   1267765 (14146)   ✓

Numbers use one precision for the simulated and one for the published columns of an experiment,
chosen from the largest value shown (:func:`choose_decimals`): integers from 1000 up
(``1267765 (14146)``), one decimal from 10 (``13.4``), two from 1, three significant digits
below.

The title ends with ``· quick`` for the quick configuration. A *modified* run (records with
``modified``: ``--set`` changed the configuration, see :mod:`shootdown.provenance`) says so in
its title, ``(modified: --set KEY=VALUE, …)``; its published columns are headed ``seed's pub …``
(``original pub …`` for an experiment without a seed id), its ``dir`` column reads
``— (modified)`` instead of a ✓/✗ verdict, and a note under the table says why::

    seed 002 · MADV_DONTNEED + … · us · quick (modified: --set variants.after.options.pcid=true)
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, Dict, Hashable, Iterable, List, Optional, Sequence, Union

import pandas as pd

from .provenance import modifying_sets, split_sets
from .records import (
    BAND_PP,
    BAND_REL,
    POINT_PROVENANCE_COLUMNS,
    _num,
    is_missing,
    row_key,
    to_dicts,
)
from .schema import BenchResult, CheckResult, ScenarioInfo

__all__ = [
    "choose_decimals",
    "format_number",
    "format_change",
    "format_table",
    "format_points",
    "to_csv",
    "to_parquet",
    "format_check",
    "format_check_list",
    "format_bench",
    "format_sweep",
    "format_listing",
    "OK_MARK",
    "MISMATCH_MARK",
    "MODIFIED_MARK",
]

OK_MARK = "✓"
MISMATCH_MARK = "✗ MISMATCH"
#: The ``dir`` cell of a modified run, where an unmodified one would have a verdict.
MODIFIED_MARK = "— (modified)"
_MISSING = "–"
_SEP = "  "


# --------------------------------------------------------------------------- numbers


def choose_decimals(values: Iterable[Any]) -> int:
    """Decimals for a group of values, from the largest magnitude: none from 1000 up
    (``1267765``), 1 from 10 (``13.4``), 2 from 1 (``1.10``), and three significant digits
    below 1 (at most 6 decimals)."""
    finite = [abs(float(v)) for v in values if not is_missing(v) and math.isfinite(float(v))]
    largest = max(finite, default=0.0)
    if largest == 0.0 or largest >= 1000:
        return 0
    if largest >= 10:
        return 1
    if largest >= 1:
        return 2
    return min(6, 2 - math.floor(math.log10(largest)))


def format_number(value: Any, decimals: int) -> str:
    """``value`` with ``decimals`` decimals, ``–`` when missing."""
    if is_missing(value):
        return _MISSING
    return f"{float(value):.{decimals}f}"


def format_change(value: Any) -> str:
    """A change in percent with its sign, e.g. ``+2.4%``; ``–`` when missing."""
    if is_missing(value):
        return _MISSING
    return f"{float(value):+.1f}%"


def _avg_stdev(avg: Any, stdev: Any, decimals: int) -> str:
    if is_missing(avg):
        return _MISSING
    if is_missing(stdev):
        return format_number(avg, decimals)
    return f"{format_number(avg, decimals)} ({format_number(stdev, decimals)})"


def _dir_mark(ok: Any) -> str:
    if ok is None or is_missing(ok):
        return ""
    return OK_MARK if bool(ok) else MISMATCH_MARK


def _modified_mark(rec: Dict[str, Any]) -> str:
    """The ``dir`` cell of a modified run: no verdict, where one would have been given."""
    known = rec.get("direction") is not None and rec.get("published_direction") is not None
    return MODIFIED_MARK if known else ""


# --------------------------------------------------------------------------- tables


def _render(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]

    def line(cells: Sequence[str]) -> str:
        return _SEP.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return [line(header), line(["-" * len(h) for h in header])] + [line(r) for r in rows]


def _unique(values: Iterable[Any], key: Any = lambda v: v) -> List[Any]:
    seen: Dict[Hashable, None] = {}
    out = []
    for v in values:
        k = key(v)
        if k not in seen:
            seen[k] = None
            out.append(v)
    return out


def _title(first: Dict[str, Any], changes: List[str]) -> str:
    """``seed 000 · TITLE · UNIT[ · quick][ (modified: --set …, …)]``."""
    ident = f"seed {first['seed']}" if first.get("seed") else str(first["experiment"])
    parts = [ident, first.get("title") or "", first.get("unit") or ""]
    if first.get("quick"):
        parts.append("quick")
    title = " · ".join(x for x in parts if x)
    if changes:
        title += " (modified: " + ", ".join(f"--set {c}" for c in changes) + ")"
    return title


def _fitted_note(recs: List[Dict[str, Any]]) -> List[str]:
    """The footnote naming the profile costs fitted on the ``*`` cells, if any."""
    fitted = _unique(k for r in recs for k in str(r.get("fitted") or "").split(",") if k)
    if not fitted:
        return []
    return [
        "",
        f"* fitted: profile {recs[0].get('profile')} fits {', '.join(fitted)} on this cell;"
        " every other cell is a prediction",
    ]


def _judgement_lines(recs: List[Dict[str, Any]]) -> List[str]:
    """The summary under a table: of the *predicted* changes (neither cell fitted on), how many
    have the published direction and how many lie in band (records.in_band); the changes whose
    cells a profile cost was fitted on are listed apart, judged but not counted."""
    judged = [r for r in recs if r.get("direction_ok") is not None]
    predicted = [r for r in judged if not r.get("change_fitted")]
    fitted = [r for r in judged if r.get("change_fitted")]
    lines: List[str] = []
    if predicted:
        bad = sum(1 for r in predicted if not r["direction_ok"])
        band = sum(1 for r in predicted if r.get("in_band"))
        summary = (
            f"predicted changes: directions {len(predicted) - bad} of {len(predicted)} match"
            + (f", {bad} MISMATCH" if bad else "")
            + f"; {band} of {len(predicted)} in band (within max({BAND_PP:g} pp,"
            f" {BAND_REL:.0%}) of the published change)"
        )
        lines.append(summary)
    if fitted:
        each = ", ".join(
            f"{r['row']} {r['label']} ({'✓' if r['direction_ok'] else '✗'}"
            f"{', in band' if r.get('in_band') else ', out of band'})"
            for r in fitted
        )
        lines.append(f"fitted changes, not counted: {each}")
    seed = recs[0].get("seed")
    if seed and any(not r["direction_ok"] or not r.get("in_band") for r in predicted):
        lines.append(f"the changes that miss, and why: docs/reproduction.md, section 'Seed {seed}'")
    return lines


def _violations_note(recs: List[Dict[str, Any]]) -> List[str]:
    """The line counting the invariant violations of the simulated runs, if any."""
    violations = sum(int(r.get("violations") or 0) for r in recs)
    if not violations:
        return []
    return [
        f"invariant violations in simulated runs: {violations} "
        "(shootdown run FILE --points --format json lists them)"
    ]


def _format_experiment(recs: List[Dict[str, Any]]) -> str:
    first = recs[0]
    modified = any(bool(r.get("modified")) for r in recs)
    changes = modifying_sets(split_sets(first.get("sets"))) if modified else []
    title = _title(first, changes)
    pub = "pub"
    if modified:
        pub = "seed's pub" if first.get("seed") else "original pub"

    variants = _unique(
        ((r["variant"], r["label"], bool(r["baseline"])) for r in recs), key=lambda v: v[0]
    )
    others = [v for v in variants if not v[2]]
    rows = _unique((r["row"] for r in recs), key=row_key)
    cell = {(row_key(r["row"]), r["variant"]): r for r in recs}
    has_pub = any(not is_missing(r["published"]) for r in recs)
    sim_dec = choose_decimals(r["simulated"] for r in recs)
    pub_dec = choose_decimals(r["published"] for r in recs)

    def change_header(prefix: str, label: str) -> str:
        name = f"{prefix}change" if len(others) <= 1 else f"{prefix}change {label}"
        return name.strip()

    header = [str(first.get("row_key") or "row")]
    header += [f"{label} avg (stdev)" for _, label, _ in variants]
    header += [change_header("", label) for _, label, _ in others]
    if has_pub:
        header += [f"{pub} {label} avg (stdev)" for _, label, _ in variants]
        header += [change_header(f"{pub} ", label) for _, label, _ in others]
        header += ["dir" if len(others) <= 1 else f"dir {label}" for _, label, _ in others]

    body: List[List[str]] = []
    for row in rows:
        rk = row_key(row)

        def get(name: str, rk: Hashable = rk) -> Dict[str, Any]:
            return cell.get((rk, name), {})

        line = [str(row)]
        line += [
            _avg_stdev(get(n).get("simulated"), get(n).get("stdev"), sim_dec)
            + ("*" if get(n).get("fitted") else "")
            for n, _, _ in variants
        ]
        line += [format_change(get(n).get("change_pct")) for n, _, _ in others]
        if has_pub:
            line += [
                _avg_stdev(get(n).get("published"), get(n).get("published_stdev"), pub_dec)
                for n, _, _ in variants
            ]
            line += [format_change(get(n).get("published_change_pct")) for n, _, _ in others]
            line += [
                _modified_mark(get(n)) if modified else _dir_mark(get(n).get("direction_ok"))
                for n, _, _ in others
            ]
        body.append(line)

    lines = [title, ""] + _render(header, body)
    lines += _fitted_note(recs)
    judged = [r for r in recs if r.get("direction_ok") is not None]
    if modified and has_pub:
        lines += [
            "",
            f"modified: --set changed the configuration; the {pub} columns are the published",
            "numbers of the unmodified one, not comparable with this run: no direction is judged",
        ]
    elif judged:
        lines += [""] + _judgement_lines(recs)
    lines += _violations_note(recs)
    return "\n".join(lines)


def _ratio(sim: Any, pub: Any) -> str:
    s, p = _num(sim), _num(pub)
    if math.isnan(s) or math.isnan(p) or p == 0:
        return ""
    return f"{s / p:.2f}"


def _counter_cell(value: Any) -> str:
    v = _num(value)
    if math.isnan(v):
        return ""
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def _format_variants_as_rows(recs: List[Dict[str, Any]]) -> str:
    """A table the way seed 004's cover letter lays it out: a line per variant; per row (vCPU
    count) the simulated metric, the published one and their ratio, then each reported counter
    simulated and published; ``*`` marks a cell a profile cost was fitted on. Below it: how
    many predicted cells land within 2× and within 25 % of the published, how many counter
    cells equal the published, and whether each variant moves the metric the way the seed
    does against the variant it builds on."""
    first = recs[0]
    modified = any(bool(r.get("modified")) for r in recs)
    changes = modifying_sets(split_sets(first.get("sets"))) if modified else []
    title = _title(first, changes)
    pub = "seed's pub" if modified else "pub"
    variants = _unique(((r["variant"], r["label"]) for r in recs), key=lambda v: v[0])
    rows = _unique((r["row"] for r in recs), key=row_key)
    cell = {(row_key(r["row"]), r["variant"]): r for r in recs}
    counters = _unique(k for r in recs for k in json.loads(r.get("counters") or "{}"))
    metric = str(first.get("metric") or "value")
    sim_dec = choose_decimals(r["simulated"] for r in recs)
    pub_dec = choose_decimals(r["published"] for r in recs)
    rk_name = str(first.get("row_key") or "row")

    header = ["variant"]
    for row in rows:
        header += [f"{metric} ({rk_name}={row})", pub, "sim/pub"]
        for c in counters:
            header += [f"{c}", pub]
    body: List[List[str]] = []
    predicted: List[float] = []
    counter_cells = counter_equal = 0
    for name, label in variants:
        line = [label]
        for row in rows:
            r = cell.get((row_key(row), name), {})
            sim, p = r.get("simulated"), r.get("published")
            line += [
                format_number(sim, sim_dec) + ("*" if r.get("fitted") else ""),
                format_number(p, pub_dec) if not is_missing(p) else "",
                _ratio(sim, p),
            ]
            if not r.get("fitted") and not is_missing(p) and not is_missing(sim) and _num(p) != 0:
                predicted.append(_num(sim) / _num(p))
            got = json.loads(r.get("counters") or "{}")
            want = json.loads(r.get("published_counters") or "{}")
            for c in counters:
                line += [_counter_cell(got.get(c)), _counter_cell(want.get(c))]
                if c in want and c in got:
                    counter_cells += 1
                    counter_equal += int(abs(float(got[c]) - float(want[c])) < 1e-9)
        body.append(line)
    lines = [title, ""] + _render(header, body)
    lines += _fitted_note(recs)
    if modified:
        lines += [
            "",
            f"modified: --set changed the configuration; the {pub} columns are the published",
            "numbers of the unmodified one, not comparable with this run",
        ]
        return "\n".join(lines + _violations_note(recs))
    if predicted:
        within2 = sum(1 for x in predicted if 0.5 <= x <= 2.0)
        within25 = sum(1 for x in predicted if 0.75 <= x <= 1.25)
        lines += [
            "",
            f"predicted {metric} cells: {within2} of {len(predicted)} within 2x of the published,"
            f" {within25} within 25%",
        ]
    if counter_cells:
        bad = counter_cells - counter_equal
        lines.append(
            f"{', '.join(counters)}: {counter_equal} of {counter_cells} cells equal the published"
            + (f", {bad} MISMATCH" if bad else "")
        )
    # Each variant against the one it builds on, per row: does the metric move as published?
    judged = bad_dirs = 0
    mismatches: List[str] = []
    fitted_dirs: List[str] = []
    for row in rows:
        for name, label in variants:
            r = cell.get((row_key(row), name), {})
            parent = r.get("builds_on")
            q = cell.get((row_key(row), parent), {}) if parent else {}
            if not q or any(is_missing(x) for x in (r.get("published"), q.get("published"))):
                continue
            sim_up = _num(r["simulated"]) > _num(q["simulated"])
            pub_up = _num(r["published"]) > _num(q["published"])
            if r.get("fitted") or q.get("fitted"):
                # A fitted cell's direction is not a prediction: listed apart, not counted.
                fitted_dirs.append(
                    f"{label} vs {q.get('label')} at {rk_name}={row}"
                    f" ({'✓' if sim_up == pub_up else '✗'})"
                )
                continue
            judged += 1
            if sim_up != pub_up:
                bad_dirs += 1
                mismatches.append(f"{label} vs {q.get('label')} at {rk_name}={row}")
    if judged:
        lines.append(
            f"{metric} vs the variant each builds on: {judged - bad_dirs} of {judged} directions"
            " match"
            + (f", {bad_dirs} MISMATCH ({'; '.join(mismatches)})" if bad_dirs else "")
            + (" (predicted: neither cell fitted on)" if fitted_dirs else "")
        )
    if fitted_dirs:
        lines.append(f"fitted directions, not counted: {'; '.join(fitted_dirs)}")
    if judged:
        seed = first.get("seed")
        if (bad_dirs or (predicted and len(predicted) > within2)) and seed:
            lines.append(
                f"the cells that miss, and why: docs/reproduction.md, section 'Seed {seed}'"
            )
    lines += _violations_note(recs)
    return "\n".join(lines)


def format_table(records: pd.DataFrame) -> str:
    """Seed-style text tables, one per experiment and configuration in ``records`` (see the
    module docstring).

    Columns: the row key, ``<label> avg (stdev)`` per variant, ``change`` per non-baseline
    variant, the same for the published numbers (``pub …``) when there are any, and ``dir``:
    ``✓`` when the simulated direction (up/down/flat) matches the published one, ``✗ MISMATCH``
    when it does not, blank when it cannot be judged, ``— (modified)`` for a modified run.
    Records of one experiment with other ``sets`` or ``quick`` get a table of their own.
    """
    recs = to_dicts(records)
    if not recs:
        return "no records\n"

    def block(r: Dict[str, Any]) -> Hashable:
        return (r["experiment"], r.get("sets") or "", bool(r.get("quick")))

    keys = _unique((block(r) for r in recs))

    def fmt(rs: List[Dict[str, Any]]) -> str:
        if rs[0].get("layout") == "variants_as_rows":
            return _format_variants_as_rows(rs)
        return _format_experiment(rs)

    blocks = [fmt([r for r in recs if block(r) == k]) for k in keys]
    return "\n\n".join(blocks) + "\n"


def format_points(points: pd.DataFrame) -> str:
    """Text of a points frame (``run --points``): one provenance line per plan
    (``experiment NAME · experiment_path FILE · …``), then one line per run without the
    provenance columns, which repeat on every row of a plan."""
    prov = [c for c in POINT_PROVENANCE_COLUMNS if c in points.columns]
    body = points.drop(columns=prov).to_string(index=False)
    if not len(points) or not prov:
        return body + "\n"
    heads = _unique(to_dicts(points[prov]), key=lambda d: tuple(str(v) for v in d.values()))
    lines = [" · ".join(f"{k} {v}" for k, v in h.items() if v not in (None, "")) for h in heads]
    return "\n".join(lines + ["", body]) + "\n"


# --------------------------------------------------------------------------- files


def to_csv(frame: pd.DataFrame, path: Optional[Union[str, Path]] = None) -> Optional[str]:
    """Write ``frame`` as CSV to ``path`` (missing values empty); return the text if no path."""
    flat = _flatten_lists(frame)
    if path is None:
        buf = io.StringIO()
        flat.to_csv(buf, index=False)
        return buf.getvalue()
    flat.to_csv(path, index=False)
    return None


def _flatten_lists(frame: pd.DataFrame) -> pd.DataFrame:
    """List-valued columns (``violations`` of a points frame) joined with `` | ``."""
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object and out[col].map(lambda v: isinstance(v, list)).any():
            out[col] = out[col].map(lambda v: " | ".join(map(str, v)) if isinstance(v, list) else v)
    return out


def to_parquet(frame: pd.DataFrame, path: Union[str, Path]) -> None:
    """Write ``frame`` as Parquet (needs ``pyarrow``: ``pip install 'shootdown[parquet]'``).

    A ``row`` column mixing numbers and strings is written as strings.
    """
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "writing Parquet needs pyarrow: pip install 'shootdown[parquet]'"
        ) from exc
    out = frame.copy()
    out.attrs = {}
    if "row" in out.columns:
        kinds = {type(v).__name__ for v in out["row"] if v is not None}
        if len(kinds) > 1 or kinds == {"str"}:
            out["row"] = out["row"].map(lambda v: None if v is None else str(v))
    out.to_parquet(path, index=False)


# --------------------------------------------------------------------------- checker / bench


def _speed(result: CheckResult) -> str:
    """``  states/s: N  peak memory: M MB`` for what the result knows of them."""
    out = ""
    rate = result.get("states_per_s")
    if rate is not None:
        out += f"  states/s: {float(rate):,.0f}"
    rss = result.get("peak_rss_mb")
    if rss is not None:
        out += f"  peak memory: {float(rss):,.0f} MB"
    return out


def format_check(result: CheckResult) -> str:
    """Text report of a :func:`shootdown.check` result: verdict, size, counterexample."""
    verdict = result["verdict"]
    head = f"verdict: {verdict}"
    if result.get("invariant"):
        head += f" ({result['invariant']})"
    what = [f"scenario {result['scenario']}"]
    if result.get("mutant"):
        bug = result.get("bug")
        label = f" [{bug_label(bug['id'], bug.get('fix'), bug.get('cves'))}]" if bug else ""
        what.append(f"mutant {result['mutant']}{label}")
    what.append(f"memory model {result['memory_model']}")
    lines = [
        head,
        " · ".join(what),
        f"states: {result['states']}  transitions: {result['transitions']}  "
        f"seconds: {float(result['seconds']):.2f}" + _speed(result),
    ]
    lines += [f"note: {n}" for n in result.get("notes") or []]
    steps = result.get("counterexample") or []
    if steps:
        setup = result.get("setup") or []
        actor_w = max(len(str(s["actor"])) for s in [*setup, *steps])
        if setup:
            lines.append("setup (deterministic, before exploring):")
            num_w = len(str(max(int(s["step"]) for s in setup)))
            for s in setup:
                lines.append(
                    f"  s{str(s['step']).rjust(num_w)}. {str(s['actor']).ljust(actor_w)}  "
                    f"{s['text']}"
                )
        lines.append("counterexample:")
        num_w = len(str(max(int(s["step"]) for s in steps)))
        for s in steps:
            lines.append(
                f"  {str(s['step']).rjust(num_w)}. {str(s['actor']).ljust(actor_w)}  {s['text']}"
            )
    return "\n".join(lines) + "\n"


def bug_label(bug: str, fix: Optional[str], cves: Optional[Sequence[str]]) -> str:
    """``K1 · CVE-2019-3016 · fix 8c6de56a42e0``: a catalogued bug as listings name it."""
    parts = [bug, *(cves or [])]
    if fix:
        parts.append(f"fix {fix}")
    return " · ".join(parts)


def format_check_list(scenarios: Sequence[ScenarioInfo]) -> str:
    """Text listing of scenarios and their mutants."""
    if not scenarios:
        return "no scenarios\n"
    lines: List[str] = []
    for sc in scenarios:
        lines.append(f"{sc['scenario']}  {sc.get('description', '')}".rstrip())
        mutants = sc.get("mutants") or []
        width = max((len(m["name"]) for m in mutants), default=0)
        for m in mutants:
            bug = f"[{bug_label(m['bug'], m.get('fix'), m.get('cves'))}] " if m.get("bug") else ""
            expect = (
                f" (expect {m['expect']} under {m.get('memory_model') or 'sc'})"
                if m.get("expect")
                else ""
            )
            lines.append(
                f"  - {m['name'].ljust(width)}  {bug}{m.get('description', '')}{expect}".rstrip()
            )
    return "\n".join(lines) + "\n"


def format_bench(result: BenchResult) -> str:
    """Text report of a :func:`shootdown.bench` result."""
    return (
        f"steps/s: {float(result['steps_per_s']):,.0f}\n"
        f"simulated s per wall s: {float(result['sim_s_per_wall_s']):.4g}\n"
        f"({int(result['steps'])} steps, {float(result['sim_ns']) / 1e9:.4g} simulated s "
        f"in {float(result['wall_s']):.3f} wall s)\n"
    )


# --------------------------------------------------------------------------- sweeps / listings


def format_sweep(summary: pd.DataFrame, title: str = "", row_key: str = "row") -> str:
    """Text table of :func:`shootdown.summarize_sweep`: one line per (combination, row,
    variant) with the grid values in front (as TOML text), the row under ``row_key``,
    ``n``, ``avg (stdev)`` (one precision for the whole table) and the ``change`` against the
    combination's baseline variant; a ``violations`` column only when a run saw one."""
    recs = to_dicts(summary)
    if not recs:
        return (title + "\n\n" if title else "") + "no points\n"
    columns = [str(c) for c in summary.columns]
    grid_keys = columns[1 : columns.index("row")] if "row" in columns else []
    decimals = choose_decimals(r["avg"] for r in recs)
    show_violations = any(int(r.get("violations") or 0) for r in recs)
    header = grid_keys + [row_key or "row", "variant", "n", "avg (stdev)", "change"]
    if show_violations:
        header.append("violations")
    body = []
    for r in recs:
        line = [_grid_text(r.get(k)) for k in grid_keys]
        line += [
            str(r["row"]),
            str(r.get("label") or r["variant"]),
            str(r.get("n", "")),
            _avg_stdev(r["avg"], r["stdev"], decimals),
            "" if r.get("baseline") else format_change(r.get("change_pct")),
        ]
        if show_violations:
            line.append(str(int(r.get("violations") or 0)))
        body.append(line)
    lines = ([title, ""] if title else []) + _render(header, body)
    return "\n".join(lines) + "\n"


def _grid_text(value: Any) -> str:
    """A grid value as shown in a table: its TOML text, ``–`` when missing."""
    if isinstance(value, str):
        return value
    if value is None or (not isinstance(value, (list, dict)) and is_missing(value)):
        return _MISSING
    from .sweep import toml_literal

    try:
        return toml_literal(value)
    except TypeError:
        return str(value)


def _cut(line: str, width: Optional[int]) -> str:
    if width is None or len(line) <= width:
        return line
    return line[: max(1, width - 1)].rstrip() + "…"


def format_listing(
    entries: Sequence[Dict[str, Any]],
    kinds: Sequence[str],
    width: Optional[int] = None,
) -> str:
    """Text of ``shootdown list``: one aligned line per experiment (name, seed, title), profile
    (name, description) or scenario (name, mutants, description).

    ``kinds`` are the sections asked for (``"experiments"``, ``"profiles"``, ``"scenarios"``);
    with more than one, each gets a heading and its lines are indented. Lines longer than
    ``width`` are cut with ``…``.
    """
    headings = {
        "experiments": "experiments (shootdown run NAME, sweep NAME, trace NAME, …)",
        "profiles": "profiles (experiment.profile = NAME)",
        "scenarios": "scenarios (shootdown check NAME)",
    }
    kind_of = {"experiments": "experiment", "profiles": "profile", "scenarios": "scenario"}
    blocks = []
    for kind in kinds:
        mine = [e for e in entries if e.get("kind") == kind_of[kind]]
        rows: List[List[str]] = []
        for e in mine:
            if kind == "experiments":
                rows.append([e["name"], e.get("seed") or "", e.get("title") or ""])
            elif kind == "profiles":
                rows.append([e["name"], e.get("description") or ""])
            else:
                n = int(e.get("mutants") or 0)
                mutants = f"{n} mutant{'' if n == 1 else 's'}"
                rows.append([e["name"], mutants, e.get("description") or ""])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))] if rows else []
        indent = "  " if len(kinds) > 1 else ""
        lines = [
            _cut(indent + _SEP.join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), width)
            for r in rows
        ]
        if not lines:
            lines = [f"{indent}(none)"]
        if len(kinds) > 1:
            lines.insert(0, headings[kind] + ":")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
