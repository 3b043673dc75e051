"""The figure of ``shootdown validate``: real beside simulated µs per operation against the
number of siblings T, one panel per operation, busy and sleeping siblings as separate lines.

Drawn from a validation document (``shootdown validate --format json``) by ``shootdown plot
--from-json FILE``; calibration inputs are hollow markers, predictions filled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Union

import pandas as pd

from ._bridge import ConfigError
from .plot import _matplotlib, _save

__all__ = ["is_validation_document", "load_validation", "plot_validation"]


def is_validation_document(path: Union[str, Path]) -> bool:
    """Whether ``path`` holds a validation document (not reproduction records)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        return b'"kind": "validation"' in head or b'"kind":"validation"' in head
    except OSError:
        return False


def load_validation(path: Union[str, Path]) -> pd.DataFrame:
    """The cases of a validation document as a frame; a bad file is a one-line error."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: -: not a validation document ({exc})") from None
    cases = doc.get("cases") if isinstance(doc, dict) else None
    if not isinstance(cases, list) or not cases:
        raise ConfigError(f"{path}: cases: missing or empty")
    for i, c in enumerate(cases):
        if not isinstance(c, dict):
            raise ConfigError(f"{path}: cases[{i}]: expected an object")
        for key, types, what in _CASE_FIELDS:
            if key not in c:
                raise ConfigError(f"{path}: cases[{i}].{key}: missing")
            v = c[key]
            if not isinstance(v, types) or isinstance(v, bool):
                raise ConfigError(
                    f"{path}: cases[{i}].{key}: expected {what}, got {type(v).__name__} {v!r:.40}"
                )
    return pd.DataFrame(cases)


#: The fields a validation case needs to be drawn, with their JSON types (``sim_us`` may be
#: null: a case the profile's machine could not run).
_CASE_FIELDS = (
    ("case", (str,), "a string"),
    ("op", (str,), "a string"),
    ("pages", (int,), "an integer"),
    ("siblings", (int,), "an integer"),
    ("mode", (str,), "a string"),
    ("real_us", (int, float), "a number"),
    ("sim_us", (int, float, type(None)), "a number or null"),
    ("fitted", (str,), "a string"),
)


def _family(row: Dict[str, Any]) -> str:
    return "munmap-2M" if row["op"] == "munmap" else f"{row['op']}-{row['pages']}"


def plot_validation(frame: pd.DataFrame, out: Union[str, Path]) -> Path:
    """Write the figure to ``out`` (.svg, .pdf or .png)."""
    _matplotlib()
    from matplotlib.figure import Figure

    frame = frame.copy()
    frame["family"] = [_family(r) for r in frame.to_dict("records")]
    families = list(dict.fromkeys(frame["family"]))
    fig = Figure(figsize=(3.2 * len(families), 3.4), layout="constrained")
    axes = fig.subplots(1, len(families), squeeze=False)[0]
    colours = {"busy": "tab:red", "sleeping": "tab:blue"}
    for ax, family in zip(axes, families):
        part = frame[frame["family"] == family]
        alone = part[part["siblings"] == 0]
        for mode, colour in colours.items():
            lines = pd.concat([alone, part[part["mode"] == mode]]).sort_values("siblings")
            if len(lines) < 2 and not len(part[part["mode"] == mode]):
                continue
            t = lines["siblings"].astype(int)
            ax.plot(t, lines["real_us"], "-x", color=colour, label=f"real, {mode}")
            ax.plot(t, lines["sim_us"], "--", color=colour, label=f"simulated, {mode}")
            for x, y, fitted in zip(t, lines["sim_us"], lines["fitted"]):
                ax.plot([x], [y], "o", color=colour, fillstyle="none" if fitted else "full")
        ax.set_title(family, fontsize=10)
        ax.set_xlabel("siblings T")
        ax.set_ylim(bottom=0)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("µs per operation")
    axes[-1].legend(fontsize=7, loc="best")
    fig.suptitle(
        "real (solid) vs simulated (dashed); hollow: calibration input, filled: prediction",
        fontsize=9,
    )
    return _save(fig, out)
