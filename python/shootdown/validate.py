"""``shootdown validate``: every shootdown case of :mod:`shootdown.hostcases` measured on this
machine and simulated on its calibrated profile, side by side.

The cells the profile's costs were fitted on (its ``fitted`` lists) are marked and left out of the
summary; every other cell is a prediction. The summary gives the median |error| of the predicted
cells and how many fall within 25 % of the real median.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pandas as pd

from . import hostcases, twin
from .calibrate import measure_cases

__all__ = ["BAND", "validate", "format_table", "summary", "host_mismatch"]

#: A predicted case is "within band" when |error| is at most this.
BAND = 0.25

COLUMNS = [
    "case",
    "op",
    "pages",
    "siblings",
    "mode",
    "real_us",
    "real_min_us",
    "real_max_us",
    "sim_us",
    "sim_stdev_us",
    "error_pct",
    "real_tlb_ipis_per_op",
    "sim_tlb_ipis_per_op",
    "fitted",
    "violations",
    "disturbed",
]


def _fitted_cells(profile: Dict[str, Any]) -> Dict[str, List[str]]:
    """Cell id → the cost keys fitted on it."""
    cells: Dict[str, List[str]] = {}
    for key, v in profile.get("cost", {}).items():
        if isinstance(v, dict):
            for cell in v.get("fitted", []) or []:
                cells.setdefault(str(cell), []).append(key)
    return cells


def host_mismatch(machine: Dict[str, Any], host: Dict[str, Any]) -> Optional[str]:
    """Why the profile looks like another machine's, or ``None``."""
    cpus = hostcases.cpu_count(host)
    diffs = []
    if str(machine.get("cpu_model", "")) != str(host.get("cpu_model", "")):
        diffs.append(f"CPU '{machine.get('cpu_model')}' vs '{host.get('cpu_model')}'")
    if int(machine.get("online_cpus", 0)) != cpus:
        diffs.append(f"{machine.get('online_cpus')} vs {cpus} online CPUs")
    if str(machine.get("kernel", "")) != str(host.get("kernel_release", "")):
        diffs.append(f"kernel {machine.get('kernel')} vs {host.get('kernel_release')}")
    return "; ".join(diffs) or None


def validate(
    profile_path: Path,
    reps: int = 5,
    target_ms: float = 30.0,
    progress: Optional[Callable[[str, int, int], None]] = None,
    host: Optional[Dict[str, Any]] = None,
) -> pd.DataFrame:
    """Measure and simulate every case; one row per case (columns :data:`COLUMNS`).

    ``frame.attrs`` holds ``host`` (this machine), ``machine`` (the profile's) and ``profile``.
    """
    profile_path = Path(profile_path)
    profile = twin.load_profile_file(profile_path)
    machine = twin.machine_of(profile, profile_path)
    host = host if host is not None else hostcases.probe()
    cases = hostcases.shootdown_cases(hostcases.online_cpus(host))
    noise: List[str] = []
    measured = measure_cases(cases, reps, target_ms, progress, noise)
    # The twin has the profile's machine: on another host, only the cases both can run.
    twin_cases = [c for c in cases if c.siblings < int(machine["online_cpus"])]
    simulated = twin.simulate(profile_path, twin_cases)
    fitted = _fitted_cells(profile)
    rows = []
    for c in cases:
        real = measured[c.name]
        sim = simulated.get(c.name)
        sim_us = sim["median_us"] if sim else math.nan
        real_us = float(real["median_us"])
        rows.append(
            {
                "case": c.name,
                "op": c.op,
                "pages": c.pages,
                "siblings": c.siblings,
                "mode": c.mode if c.siblings else "",
                "real_us": real_us,
                "real_min_us": float(real["min_us"]),
                "real_max_us": float(real["max_us"]),
                "sim_us": sim_us,
                "sim_stdev_us": sim["stdev_us"] if sim else math.nan,
                "error_pct": (sim_us - real_us) / real_us * 100.0 if real_us > 0 else math.nan,
                "real_tlb_ipis_per_op": real.get("tlb_ipis_per_op"),
                "sim_tlb_ipis_per_op": sim["tlb_ipis_per_op"] if sim else math.nan,
                "fitted": ",".join(sorted(fitted.get(c.cell, []))),
                "violations": len(sim["violations"]) if sim else 0,
                "disturbed": real.get("disturbed", ""),
            }
        )
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.attrs.update(host=host, machine=machine, profile=str(profile_path), warnings=noise)
    return frame


def summary(frame: pd.DataFrame) -> Dict[str, Any]:
    """The predicted cells' median |error| % and how many are within :data:`BAND`."""
    predicted = frame[(frame["fitted"] == "") & frame["error_pct"].notna()]
    errors = predicted["error_pct"].abs()
    return {
        "predicted": int(len(predicted)),
        "within_band": int((errors <= BAND * 100).sum()),
        "median_abs_error_pct": float(errors.median()) if len(errors) else math.nan,
        "fitted": int((frame["fitted"] != "").sum()),
    }


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{nd}f}"


def format_table(frame: pd.DataFrame) -> str:
    """The comparison as a text table, with the summary below."""
    head = ["case", "real µs (min–max)", "sim µs (sd)", "error", "TLB IPIs/op real", "sim"]
    body = []
    for r in frame.to_dict("records"):
        mark = ("*" if r["fitted"] else "") + ("!" if r.get("disturbed") else "")
        body.append(
            [
                r["case"],
                f"{_fmt(r['real_us'])} ({_fmt(r['real_min_us'])}–{_fmt(r['real_max_us'])})",
                f"{_fmt(r['sim_us'])} ({_fmt(r['sim_stdev_us'])})",
                (f"{r['error_pct']:+.0f} %" if not math.isnan(r["error_pct"]) else "—") + mark,
                _fmt(r["real_tlb_ipis_per_op"]),
                _fmt(r["sim_tlb_ipis_per_op"]),
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(head, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in body]
    s = summary(frame)
    lines.append("")
    for r in frame.to_dict("records"):
        if r["fitted"]:
            keys = r["fitted"].replace(",", ", ")
            lines.append(f"* {r['case']}: calibration input (fits {keys}), not a prediction.")
    lines.append(
        f"predicted cells: {s['predicted']}, within {int(BAND * 100)} % of the real median: "
        f"{s['within_band']}, median |error| {_fmt(s['median_abs_error_pct'], 1)} %"
    )
    if (frame["disturbed"] != "").any():
        lines.append(
            "! disturbed: in the kept (median) round, other work on the machine spread the "
            "repetitions or took the busy siblings' CPUs (see the warnings)."
        )
    if int(frame["violations"].sum()):
        lines.append(
            f"warning: {int(frame['violations'].sum())} invariant violation(s) in the model"
        )
    return "\n".join(lines)
