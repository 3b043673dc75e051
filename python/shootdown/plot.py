"""Plots of records (needs matplotlib: ``pip install 'shootdown[plot]'``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Union

import pandas as pd

from .records import is_missing, row_key, to_dicts

__all__ = ["plot_experiment"]


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'shootdown[plot]'") from exc
    return Figure


def plot_experiment(
    records: pd.DataFrame,
    path: Union[str, Path],
    experiment: Optional[str] = None,
) -> Path:
    """Plot simulated (solid, with ±stdev bars) and published (dashed) values per variant.

    One panel per experiment in ``records`` (or only ``experiment``), rows on the x axis.
    The format follows ``path``'s suffix (``.png``, ``.svg``, ``.pdf`` …). Uses matplotlib's
    object API, so it never changes the pyplot backend of the caller.

    Returns:
        ``Path(path)``.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: nothing to plot.
    """
    Figure = _figure_class()
    recs = to_dicts(records)
    if experiment is not None:
        recs = [r for r in recs if r["experiment"] == experiment]
    names: List[str] = list(dict.fromkeys(r["experiment"] for r in recs))
    if not names:
        raise ValueError("no records to plot")

    fig = Figure(figsize=(7.5, 3.6 * len(names)), constrained_layout=True)
    axes = fig.subplots(len(names), 1, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        mine = [r for r in recs if r["experiment"] == name]
        first = mine[0]
        rows = list({row_key(r["row"]): r["row"] for r in mine}.values())
        xs = list(range(len(rows)))
        variants = list(dict.fromkeys(r["variant"] for r in mine))
        for k, variant in enumerate(variants):
            vr = {row_key(r["row"]): r for r in mine if r["variant"] == variant}
            cells = [vr.get(row_key(row), {}) for row in rows]
            label = next(r["label"] for r in mine if r["variant"] == variant)
            color = f"C{k}"
            sim = [c.get("simulated") for c in cells]
            err = [0.0 if is_missing(c.get("stdev")) else c["stdev"] for c in cells]
            ax.errorbar(
                xs,
                [float("nan") if is_missing(v) else v for v in sim],
                yerr=err,
                color=color,
                marker="o",
                capsize=3,
                label=f"{label} (simulated)",
            )
            pub = [c.get("published") for c in cells]
            if any(not is_missing(v) for v in pub):
                ax.plot(
                    xs,
                    [float("nan") if is_missing(v) else v for v in pub],
                    color=color,
                    linestyle="--",
                    marker="x",
                    label=f"{label} (published)",
                )
        ident = f"seed {first['seed']}" if first.get("seed") else name
        ax.set_title(f"{ident} · {first.get('title', '')}", fontsize=9)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(r) for r in rows])
        ax.set_xlabel(str(first.get("row_key") or "row"))
        ax.set_ylabel(f"{first.get('metric', '')} ({first.get('unit', '')})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    out = Path(path)
    fig.savefig(out)
    return out
