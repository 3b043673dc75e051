"""Figures of records (needs matplotlib: ``pip install 'shootdown[plot]'``).

Two kinds of figure, one panel per experiment, the rows of the experiment on the x axis:

* ``"change"`` draws what the seeds claim: the change of each non-baseline
  variant against the baseline variant of the same row, in % of the baseline mean — the
  simulated change beside the published one. Error bars are ±1 standard error of the
  difference of the two means, ``sqrt(s_b²/n_b + s_v²/n_v) / |mean_b| × 100`` (``s`` the
  sample standard deviations, ``n`` the repetitions). The published side uses the paper's
  standard deviations; its ``n`` comes from a ``published_n`` column when the records have
  one, and is otherwise unknown: the bar then takes ``n = 1`` (the widest it can be) and the
  caption says so. A cell with ``n < 2`` or a paper without standard deviations has no bar.
* ``"values"`` draws the absolute means per variant, simulated beside published, each with
  ±1 sample standard deviation (the ``avg (stdev)`` of the seeds' tables). An experiment whose
  tables have a line per variant (``layout = "variants_as_rows"``, seed 004) has its variants
  on the x axis instead, a colour per row, and a log axis when its values span decades.

A third kind, ``"auto"`` (the default of ``shootdown plot``), chooses per experiment
(:func:`auto_kinds`): ``"values"`` for an experiment laid out ``variants_as_rows`` or with more
than :data:`AUTO_MAX_CHANGE_VARIANTS` non-baseline variants (their changes would be a crowd of
bars and legend entries), ``"change"`` otherwise. A figure of several experiments may so mix
the two kinds, a panel each.

Figures use matplotlib's object API (:class:`matplotlib.figure.Figure`), never pyplot, so they
never change the caller's backend or current figure. The format follows the file's suffix
(``.svg``, ``.pdf``, ``.png`` at 300 dpi, or anything else matplotlib writes); SVG and PDF
files carry no date, so the same records give the same file.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple, Union

import pandas as pd

from ._bridge import ConfigError
from .records import (
    FLOAT_RECORD_COLUMNS,
    RECORD_COLUMNS,
    concat_records,
    is_missing,
    row_key,
    to_dicts,
)

__all__ = [
    "KINDS",
    "AUTO",
    "AUTO_MAX_CHANGE_VARIANTS",
    "auto_kinds",
    "PNG_DPI",
    "change_se_pct",
    "check_figure_path",
    "load_records",
    "figure",
    "change_figure",
    "values_figure",
    "plot_records",
    "plot_change",
    "plot_values",
    "plot_experiment",
]

#: The kinds of figure :func:`plot_records` draws.
KINDS: Tuple[str, ...] = ("change", "values")

#: The kind that is one of :data:`KINDS` per experiment, as :func:`auto_kinds` chooses.
AUTO = "auto"

#: ``"auto"`` draws an experiment with more non-baseline variants than this as values.
AUTO_MAX_CHANGE_VARIANTS = 4

#: Resolution of raster (PNG, JPEG …) figures.
PNG_DPI = 300

_PLOT_EXTRA = "pip install 'shootdown[plot]'"
_WIDTH_IN = 7.0  # a two-column paper figure
_PANEL_H_IN = 2.7
_SLANTED_IN = 0.6  # under a panel whose x axis names variants, slanted
_FONT = 8.0
_SMALL = 6.5
_MINUS = "\u2212"  # typographic minus, as matplotlib's own tick labels
_CAPTION_CHARS = 150  # characters per caption line at _SMALL points over _WIDTH_IN
_UNIT_SUFFIXES = {
    "ns": "ns",
    "us": "µs",
    "ms": "ms",
    "s": "s",
    "kb": "KiB",
    "kib": "KiB",
    "mb": "MiB",
    "mib": "MiB",
    "gb": "GiB",
    "pct": "%",
    "percent": "%",
    "mhz": "MHz",
    "ghz": "GHz",
}
# A values panel of more variants than this has a legend entry per variant (and the marker
# styles once), in columns under a narrow panel; a by-variant table's legend a column per side.
_MANY_SERIES = 4
_MANY_LEGEND_COLUMNS = 2
_VARIANT_LEGEND_COLUMNS = 2
# Columns a records file must have to be plotted (the rest default to missing).
_NEEDED = ("experiment", "row", "variant", "baseline", "n", "simulated", "stdev")
# The JSON type of the typed columns of a records file (each may also be null).
_NUMBER, _INTEGER, _BOOLEAN, _TEXT = "a number", "an integer", "true or false", "a string"
_RECORD_TYPES: Dict[str, str] = {
    **{c: _NUMBER for c in (*FLOAT_RECORD_COLUMNS, "published_n")},
    **{c: _INTEGER for c in ("n", "violations", "repetitions", "rng_seed")},
    **{c: _BOOLEAN for c in ("baseline", "higher_is_better", "modified", "quick")},
    **{c: _TEXT for c in ("experiment", "variant", "label", "layout")},
}


# --------------------------------------------------------------------------- matplotlib


def _matplotlib() -> Any:
    """``matplotlib`` itself, or an ImportError naming the extra."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"plotting needs matplotlib: {_PLOT_EXTRA}") from exc
    return matplotlib


def _supported_suffixes() -> Dict[str, str]:
    _matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    return dict(FigureCanvasBase.get_supported_filetypes())


def check_figure_path(path: Union[str, Path], option: str = "--out") -> None:
    """Fail before any work: matplotlib is installed, the directory exists and the suffix is a
    format matplotlib writes.

    Raises:
        ImportError: matplotlib is not installed (the message names the extra).
        ConfigError: a missing directory or an unknown suffix (one line naming ``path``).
    """
    out = Path(path)
    if not out.resolve().parent.is_dir():
        raise ConfigError(
            f"{out}: {option}: directory {out.parent} does not exist "
            f"(create it first: mkdir -p {out.parent})"
        )
    try:
        formats = _supported_suffixes()
    except ImportError:
        raise ImportError(f"{out}: {option}: plotting needs matplotlib: {_PLOT_EXTRA}") from None
    suffix = out.suffix.lower().lstrip(".")
    if suffix not in formats:
        others = ", ".join("." + s for s in sorted(formats) if s not in ("svg", "pdf", "png"))
        raise ConfigError(
            f"{out}: {option}: the file name must end in .svg, .pdf or .png "
            f"(matplotlib also writes {others})"
        )


def _save(fig: Any, path: Union[str, Path]) -> Path:
    """Save by suffix: PNG (and other rasters) at :data:`PNG_DPI`, SVG/PDF without a date."""
    import matplotlib

    out = Path(path)
    suffix = out.suffix.lower().lstrip(".")
    kwargs: Dict[str, Any] = {"dpi": PNG_DPI}
    if suffix in ("svg", "svgz", "pdf"):
        kwargs["metadata"] = {"Date": None} if suffix != "pdf" else {"CreationDate": None}
    # Stable SVG element ids; PDF with TrueType (Type 42) fonts, not Type 3, as publishers ask.
    rc = {"svg.hashsalt": "shootdown", "pdf.fonttype": 42, "ps.fonttype": 42}
    with matplotlib.rc_context(rc):
        fig.savefig(out, **kwargs)
    return out


# --------------------------------------------------------------------------- records in


def load_records(path: Union[str, Path]) -> pd.DataFrame:
    """Records written by ``shootdown reproduce --format json`` or ``run --format json``.

    Returns:
        A records frame (columns :data:`shootdown.records.RECORD_COLUMNS`, plus any other
        column the file has, such as ``published_n``).

    Raises:
        ConfigError: the file is missing, is not JSON, or holds something else than records
            (e.g. the per-run points of ``run --points``).
    """
    src = Path(path)
    try:
        raw = src.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{src}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{src}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{src}: not JSON: not UTF-8 text (byte {exc.start}; a binary file?)"
        ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{src}: not JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{src}: not JSON (nested too deeply)") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ConfigError(
            f"{src}: expected a JSON array of records "
            "(shootdown reproduce --format json, or run --format json)"
        )
    if not data:
        raise ConfigError(f"{src}: no records")
    if "rep" in data[0] and "simulated" not in data[0]:
        raise ConfigError(
            f"{src}: these are per-run points (run --points); plotting needs records: "
            "write them with run --format json, without --points"
        )
    missing = [c for c in _NEEDED if any(c not in r for r in data)]
    if missing:
        raise ConfigError(f"{src}: not records: missing key(s) {', '.join(missing)}")
    for number, record in enumerate(data):
        problem = _record_problem(record)
        if problem is not None:
            raise ConfigError(f"{src}: [{number}].{problem}")
    rows = [{col: r.get(col) for col in RECORD_COLUMNS} for r in data]
    try:
        frame = concat_records([pd.DataFrame(rows, columns=list(RECORD_COLUMNS))])
    except (TypeError, ValueError, OverflowError) as exc:  # a type no check above foresaw
        raise ConfigError(f"{src}: not records ({' '.join(str(exc).split())})") from None
    extra = [k for k in dict.fromkeys(k for r in data for k in r) if k not in RECORD_COLUMNS]
    for key in extra:
        frame[key] = pd.Series([r.get(key) for r in data], dtype=object, index=frame.index)
    return frame


def _record_problem(record: Dict[str, Any]) -> Optional[str]:
    """Why a record read from a file cannot be drawn (a value of the wrong JSON type), or
    ``None``."""

    def shown(value: Any) -> str:
        if isinstance(value, bool):
            kind = "a boolean"
        elif isinstance(value, (int, float)):
            kind = "a number"
        elif isinstance(value, str):
            kind = "a string"
        else:
            kind = "an array" if isinstance(value, list) else "an object"
        text = json.dumps(value, ensure_ascii=False)
        return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"

    row = record.get("row")
    if isinstance(row, (list, dict, bool)):
        return f"row: expected a number, a string or null, got {shown(row)}"
    for col, kind in _RECORD_TYPES.items():
        value = record.get(col)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = {
            _NUMBER: number,
            _INTEGER: number and float(value).is_integer(),
            _BOOLEAN: isinstance(value, bool),
            _TEXT: isinstance(value, str),
        }[kind]
        if not ok:
            return f"{col}: expected {kind} or null, got {shown(value)}"
    return None


# --------------------------------------------------------------------------- numbers


def _num(value: Any) -> float:
    if is_missing(value):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def change_se_pct(
    baseline_avg: Any, baseline_stdev: Any, baseline_n: Any, stdev: Any, n: Any
) -> float:
    """Standard error of the difference of a variant's mean and the baseline mean, in % of
    ``|baseline_avg|``: ``sqrt(s_b²/n_b + s_v²/n_v) / |baseline_avg| × 100``.

    ``NaN`` when a standard deviation or an ``n`` is missing, an ``n`` is below 1, or the
    baseline mean is missing or zero.
    """
    b, sb, nb, sv, nv = (_num(x) for x in (baseline_avg, baseline_stdev, baseline_n, stdev, n))
    if any(math.isnan(x) for x in (b, sb, nb, sv, nv)) or b == 0 or nb < 1 or nv < 1:
        return math.nan
    return math.sqrt(sb * sb / nb + sv * sv / nv) / abs(b) * 100.0


def _ns(values: Sequence[Any]) -> str:
    """``"3"``, ``"2–5"`` or ``"?"`` for a list of repetition counts."""
    known = sorted({int(v) for v in values if not is_missing(v)})
    if not known:
        return "?"
    return str(known[0]) if len(known) == 1 else f"{known[0]}–{known[-1]}"


# --------------------------------------------------------------------------- one panel's data


class _Panel:
    """The records of one experiment, arranged by row and variant."""

    def __init__(self, recs: List[Dict[str, Any]]) -> None:
        self.recs = recs
        self.first = recs[0]
        self.rows: List[Any] = list({row_key(r["row"]): r["row"] for r in recs}.values())
        seen: Dict[str, Dict[str, Any]] = {}
        for r in recs:
            seen.setdefault(str(r["variant"]), r)
        self.variants: List[Tuple[str, str]] = [
            (name, str(r.get("label") or name)) for name, r in seen.items()
        ]
        base = next((str(r["variant"]) for r in recs if r.get("baseline")), None)
        self.baseline = base if base is not None else self.variants[0][0]
        self.others = [v for v in self.variants if v[0] != self.baseline]
        self.cell: Dict[Tuple[Hashable, str], Dict[str, Any]] = {
            (row_key(r["row"]), str(r["variant"])): r for r in recs
        }

    def get(self, row: Any, variant: str) -> Dict[str, Any]:
        return self.cell.get((row_key(row), variant), {})

    @property
    def by_variant(self) -> bool:
        """The seed's tables have a line per variant (``layout = "variants_as_rows"``)."""
        return any(r.get("layout") == "variants_as_rows" for r in self.recs)

    def auto_kind(self) -> str:
        """The kind ``"auto"`` draws this experiment as (see :func:`auto_kinds`)."""
        many = len(self.others) > AUTO_MAX_CHANGE_VARIANTS
        return "values" if self.by_variant or many else "change"

    def slots(self, kind: str) -> int:
        """Places on the x axis: the variants of a values panel of a by-variant table, else
        the rows."""
        return len(self.variants) if kind == "values" and self.by_variant else len(self.rows)

    @property
    def baseline_label(self) -> str:
        return dict(self.variants)[self.baseline]

    def title(self, width: int) -> str:
        """``seed 002 · seed002-madv-dontneed`` over the experiment's title (two lines at
        most, ``width`` characters each)."""
        exp = str(self.first.get("experiment") or "")
        seed = self.first.get("seed")
        head = f"seed {seed} · {exp}" if seed else exp
        sub = str(self.first.get("title") or "")
        if not sub:
            return head
        lines = textwrap.wrap(sub, width=width)
        if len(lines) > 2:
            lines = [lines[0], textwrap.shorten(" ".join(lines[1:]), width=width, placeholder=" …")]
        return "\n".join([head] + lines)

    def row_label(self) -> str:
        """The row key with its unit (``threads (count)``, ``ipi_ns (ns)``)."""
        key = str(self.first.get("row_key") or "").strip()
        numeric = all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in self.rows)
        if not key:
            return "configuration" if not numeric else "row"
        match = re.search(r"[_\-]([A-Za-z]+)$", key)
        if match and match.group(1).lower() in _UNIT_SUFFIXES:
            return f"{key} ({_UNIT_SUFFIXES[match.group(1).lower()]})"
        if numeric and all(float(r).is_integer() for r in self.rows):
            return f"{key} (count)"
        return key

    def value_label(self) -> str:
        metric = str(self.first.get("metric") or "value")
        unit = str(self.first.get("unit") or "")
        return f"{metric} ({unit})" if unit else metric

    def better(self) -> str:
        return "higher is better" if self.first.get("higher_is_better", True) else "lower is better"

    def sim_change(self, row: Any, variant: str) -> Tuple[float, float]:
        b, v = self.get(row, self.baseline), self.get(row, variant)
        se = change_se_pct(
            b.get("simulated"), b.get("stdev"), b.get("n"), v.get("stdev"), v.get("n")
        )
        return _num(v.get("change_pct")), se

    def pub_change(self, row: Any, variant: str) -> Tuple[float, float, bool]:
        """(change, error, n known) of the published side."""
        b, v = self.get(row, self.baseline), self.get(row, variant)
        nb, nv = _num(b.get("published_n")), _num(v.get("published_n"))
        known = not (math.isnan(nb) or math.isnan(nv))
        se = change_se_pct(
            b.get("published"),
            b.get("published_stdev"),
            nb if known else 1,
            v.get("published_stdev"),
            nv if known else 1,
        )
        return _num(v.get("published_change_pct")), se, known


def _panels(records: pd.DataFrame, experiment: Optional[str]) -> List[_Panel]:
    recs = to_dicts(records)
    if experiment is not None:
        recs = [r for r in recs if experiment in (r.get("experiment"), r.get("seed"))]
    names: List[str] = list(dict.fromkeys(str(r.get("experiment")) for r in recs))
    if not names:
        what = f" of {experiment}" if experiment is not None else ""
        raise ValueError(f"no records{what} to plot")
    return [_Panel([r for r in recs if str(r.get("experiment")) == n]) for n in names]


# --------------------------------------------------------------------------- layout helpers


def _narrow(panels: List[_Panel], kinds: Sequence[str]) -> bool:
    """Whether every panel has at most two places on its x axis: two panels side by side."""
    return all(p.slots(k) <= 2 for p, k in zip(panels, kinds))


def _legend_lines(panel: _Panel, kind: str) -> int:
    """Lines of the panel's legend under a narrow panel (an upper bound)."""
    if kind == "values" and panel.by_variant:
        return math.ceil(2 * len(panel.rows) / _VARIANT_LEGEND_COLUMNS)
    if kind == "values" and len(panel.variants) > _MANY_SERIES:
        return math.ceil((len(panel.variants) + 2) / _MANY_LEGEND_COLUMNS)
    return 2 * len(panel.variants)


def _layout(
    panels: List[_Panel], kinds: Sequence[str], caption_lines: int
) -> Tuple[Any, List[Any], Any]:
    """A figure with one sub-figure (title, axes, legend) per panel — stacked, or two side by
    side when every panel has at most two places on its x axis — over a caption sub-figure.

    Returns:
        ``(figure, axes per panel, caption sub-figure)``.
    """
    _matplotlib()
    from matplotlib.figure import Figure

    narrow = _narrow(panels, kinds)
    ncols = min(len(panels), 2) if narrow else 1
    nrows = math.ceil(len(panels) / ncols)
    caption_in = 0.1 + caption_lines * _SMALL * 1.3 / 72.0
    # A legend under a narrow panel takes a line per series beyond the first few.
    lines = max(_legend_lines(p, k) for p, k in zip(panels, kinds))
    legend_in = 0.16 * max(0, lines - 6) if narrow else 0.0
    # Variants' names slanted under an axis take the height of a few lines more.
    slanted = [k == "values" and p.by_variant for p, k in zip(panels, kinds)]
    rows_in = [
        _PANEL_H_IN + legend_in + (_SLANTED_IN if any(slanted[i : i + ncols]) else 0.0)
        for i in range(0, len(panels), ncols)
    ]
    fig = Figure(figsize=(_WIDTH_IN, sum(rows_in) + caption_in), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[sum(rows_in), caption_in])
    grid = top.subfigures(nrows, ncols, squeeze=False, height_ratios=rows_in)
    subs = [sub for line in grid for sub in line]
    title_chars = int(_WIDTH_IN / ncols * 72.0 / (_FONT * 0.55))
    titles = [panel.title(title_chars) for panel in panels]
    lines = max(t.count("\n") for t in titles)
    axes = []
    for sub, title in zip(subs, titles):  # as many title lines everywhere: the axes align
        axes.append(sub.subplots())
        sub.suptitle(title + "\n" * (lines - title.count("\n")), x=0.02, ha="left", fontsize=_FONT)
    return fig, axes, bottom


def _caption(sub: Any, paragraphs: Sequence[str]) -> None:
    lines = [ln for p in paragraphs for ln in textwrap.wrap(p, width=_CAPTION_CHARS)]
    sub.text(0.012, 0.5, "\n".join(lines), ha="left", va="center", fontsize=_SMALL, color="0.2")


def _caption_lines(paragraphs: Sequence[str]) -> int:
    return sum(len(textwrap.wrap(p, width=_CAPTION_CHARS)) for p in paragraphs)


def _style(ax: Any) -> None:
    ax.tick_params(labelsize=_FONT - 0.5, length=3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(True, axis="y", color="0.88", linewidth=0.6)
    ax.set_axisbelow(True)


def _legend(
    ax: Any, handles: List[Any], narrow: bool, ncol: int = 1, title: Optional[str] = None
) -> None:
    """The panel's legend: under a narrow panel (in ``ncol`` columns), else on its right."""
    if not handles:
        return
    common: Dict[str, Any] = dict(handles=handles, fontsize=_SMALL, frameon=False, handlelength=1.6)
    if title is not None:
        common.update(title=title, title_fontsize=_SMALL, alignment="left")
    if narrow:  # under the panel: a narrow panel has no room on its right
        ax.get_figure().legend(loc="outside lower center", ncol=ncol, **common)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.3, **common)


def _percent_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    def fmt(value: float, _pos: Any) -> str:
        if abs(value) < 1e-9:
            return "0"
        return f"{value:+g}".replace("-", _MINUS)

    return FuncFormatter(fmt)


def _plain_formatter(largest: float) -> Any:
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    if largest >= 10000:
        return FuncFormatter(lambda v, _pos: f"{v:,.0f}")
    plain = ScalarFormatter(useOffset=False)
    plain.set_scientific(False)
    return plain


def _change_text(value: float) -> str:
    text = f"{value:+.1f}" if abs(value) < 100 else f"{value:+.0f}"
    return text.replace("-", _MINUS)


def _row_axis(ax: Any, panel: _Panel, margin: float) -> None:
    xs = list(range(len(panel.rows)))
    ax.set_xticks(xs)
    ax.set_xticklabels([str(r) for r in panel.rows])
    ax.set_xlim(-0.5 - margin, len(xs) - 0.5 + margin)
    ax.set_xlabel(panel.row_label(), fontsize=_FONT)


# --------------------------------------------------------------------------- change figure


def change_figure(
    records: pd.DataFrame,
    experiment: Optional[str] = None,
    annotate: bool = True,
) -> Any:
    """The before→after change per row, simulated beside published (see the module
    docstring for the error bars), as a :class:`matplotlib.figure.Figure`.

    Args:
        records: a records frame (:func:`shootdown.reproduce`, :func:`shootdown.to_records`,
            :func:`load_records`).
        experiment: only this experiment (name or seed id).
        annotate: print each bar's change (in %) at its end.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: nothing to plot.
    """
    _matplotlib()
    panels = _panels(records, experiment)
    return _figure(panels, ["change"] * len(panels), annotate)


def _change_paragraph(panels: List[_Panel]) -> str:
    """The caption of change panels."""
    with_sd = [r for p in panels for r in p.recs if not is_missing(r.get("published_stdev"))]
    n_unknown = any(is_missing(r.get("published_n")) for r in with_sd)
    return (
        "Bars: change of each variant's mean against the baseline variant of the same row "
        "(named on the y axis), in % of the baseline mean; solid: simulated, hatched: "
        "published. Error bars: ±1 standard error of the difference of the two means, "
        "√(s_b²/n_b + s_v²/n_v) / |mean_b| × 100, with s the sample standard deviation of "
        "n repetitions (n per cell in the legend); none where n = 1 or the paper gave no "
        "standard deviation."
        + (
            " The paper's n is not recorded with its numbers: its error bars take n = 1, "
            "the widest they can be."
            if n_unknown
            else ""
        )
        + (" n/p: not published." if _any_partly_published(panels) else "")
    )


def _values_paragraph(panels: List[_Panel]) -> str:
    """The caption of values panels."""
    text = (
        "Filled markers: simulated mean of n repetitions (n per cell in the legend); open "
        "markers: the published numbers. Error bars: ±1 sample standard deviation, the "
        "avg (stdev) of the seeds' tables; none where n = 1 or the paper gave no standard "
        "deviation."
    )
    marks = {mark for p in panels if p.by_variant for *_, mark in _foot_marks(p)}
    if "0" in marks:
        text += " 0 at the foot of a log axis: a value of zero, which the axis cannot show."
    if "n/p" in marks:
        text += " n/p: not published."
    return text


def _figure(panels: List[_Panel], kinds: Sequence[str], annotate: bool = True) -> Any:
    """One panel per experiment, each drawn as its kind ("change" or "values"), over the
    caption of the kinds drawn."""
    paragraphs = []
    if "change" in kinds:
        paragraphs.append(_change_paragraph([p for p, k in zip(panels, kinds) if k == "change"]))
    if "values" in kinds:
        paragraphs.append(_values_paragraph([p for p, k in zip(panels, kinds) if k == "values"]))
    fig, axes, bottom = _layout(panels, kinds, _caption_lines(paragraphs))
    narrow = _narrow(panels, kinds)
    for ax, panel, kind in zip(axes, panels, kinds):
        if kind == "change":
            _draw_change(ax, panel, annotate, narrow)
        else:
            _draw_values(ax, panel, narrow)
    _caption(bottom, paragraphs)
    return fig


def plot_change(
    records: pd.DataFrame,
    path: Union[str, Path],
    experiment: Optional[str] = None,
    annotate: bool = True,
) -> Path:
    """Write :func:`change_figure` to ``path`` (the suffix picks the format); returns
    ``Path(path)``."""
    return _save(change_figure(records, experiment, annotate), path)


def _published_cells(panel: _Panel, variant: str) -> List[bool]:
    return [
        not (
            is_missing(panel.get(row, variant).get("published"))
            or is_missing(panel.get(row, panel.baseline).get("published"))
        )
        for row in panel.rows
    ]


def _any_partly_published(panels: List[_Panel]) -> bool:
    for panel in panels:
        for name, _ in panel.others:
            cells = _published_cells(panel, name)
            if any(cells) and not all(cells):
                return True
    return False


def _draw_change(ax: Any, panel: _Panel, annotate: bool, narrow: bool) -> None:
    from matplotlib.patches import Patch

    _style(ax)
    xs = list(range(len(panel.rows)))
    published = {name: any(_published_cells(panel, name)) for name, _ in panel.others}
    slots = max(1, sum(2 if published[name] else 1 for name, _ in panel.others))
    group = 0.8 if len(panel.rows) > 2 else min(0.8, 0.17 * slots)
    width = group / slots
    handles: List[Any] = []
    ends: List[float] = [0.0]
    labels: List[Tuple[float, float, str]] = []
    left = -group / 2
    for k, (name, label) in enumerate(panel.others):
        color = f"C{k}"
        n_sim = _ns(
            [panel.get(row, v).get("n") for row in panel.rows for v in (name, panel.baseline)]
        )
        sims = [panel.sim_change(row, name) for row in panel.rows]
        sim_x = [x + left + width / 2 for x in xs]
        _bars(ax, sim_x, sims, width, color, None, ends, labels)
        left += width
        if not published[name]:
            handles.append(
                Patch(
                    facecolor=color,
                    edgecolor=color,
                    label=f"{label}: simulated, n = {n_sim} (not published)",
                )
            )
            continue
        handles.append(
            Patch(facecolor=color, edgecolor=color, label=f"{label}: simulated, n = {n_sim}")
        )
        pubs = [panel.pub_change(row, name) for row in panel.rows]
        pub_x = [x + left + width / 2 for x in xs]
        _bars(ax, pub_x, [(c, e) for c, e, _ in pubs], width, color, "////", ends, labels)
        left += width
        has_sd = any(not math.isnan(e) for _, e, _ in pubs)
        if not has_sd:
            note = "no stdev given"
        else:
            n_pub = _ns(
                [
                    panel.get(row, v).get("published_n")
                    for row in panel.rows
                    for v in (name, panel.baseline)
                ]
            )
            note = "n not recorded" if n_pub == "?" else f"n = {n_pub}"
        handles.append(
            Patch(
                facecolor="white",
                edgecolor=color,
                hatch="////",
                label=f"{label}: published, {note}",
            )
        )
        for x, (c, _, _) in zip(pub_x, pubs):
            if math.isnan(c):
                labels.append((x, math.nan, "n/p"))

    ax.axhline(0.0, color="0.15", linewidth=0.8, zorder=3)
    lo, hi = min(ends), max(ends)
    span = max(hi - lo, 1.0)
    ax.set_ylim(
        lo - (0.14 * span if lo < 0 else 0.04 * span), hi + (0.14 * span if hi > 0 else 0.04 * span)
    )
    if annotate:
        for x, y, text in labels:
            if math.isnan(y):  # a missing published value
                ax.text(
                    x,
                    0.02 * span,
                    text,
                    ha="center",
                    va="bottom",
                    fontsize=_SMALL - 1,
                    color="0.4",
                    rotation=90,
                )
                continue
            up = y >= 0
            ax.text(
                x,
                y + (0.015 if up else -0.015) * span,
                text,
                ha="center",
                va="bottom" if up else "top",
                fontsize=_SMALL - 1,
                color="0.15",
            )
    if not panel.others:
        ax.text(
            0.5,
            0.5,
            "one variant only: no change to draw",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=_FONT,
            color="0.4",
        )
    _row_axis(ax, panel, 0.0 if len(xs) > 2 else 0.15 if narrow else 0.6)
    ax.set_ylabel(f"change vs {panel.baseline_label} (%)\n{panel.better()}", fontsize=_FONT)
    ax.yaxis.set_major_formatter(_percent_formatter())
    _legend(ax, handles, narrow)


def _bars(
    ax: Any,
    xs: List[float],
    values: List[Tuple[float, float]],
    width: float,
    color: str,
    hatch: Optional[str],
    ends: List[float],
    labels: List[Tuple[float, float, str]],
) -> None:
    """One bar per (change, error) at ``xs``; records where each bar (with its error bar)
    ends and its label."""
    for x, (change, err) in zip(xs, values):
        if math.isnan(change):
            continue
        ax.bar(
            x,
            change,
            width=width * 0.9,
            color="white" if hatch else color,
            edgecolor=color,
            hatch=hatch,
            linewidth=0.8,
            zorder=2,
        )
        end = change
        if not math.isnan(err):
            ax.errorbar(
                x,
                change,
                yerr=err,
                fmt="none",
                ecolor="0.1",
                elinewidth=0.8,
                capsize=2.0,
                capthick=0.8,
                zorder=4,
            )
            end = change + err if change >= 0 else change - err
        ends.append(end)
        labels.append((x, end, _change_text(change)))


# --------------------------------------------------------------------------- values figure


def values_figure(records: pd.DataFrame, experiment: Optional[str] = None) -> Any:
    """The absolute means per variant and row, simulated (filled) beside published (open),
    each with ±1 sample standard deviation, as a :class:`matplotlib.figure.Figure`.

    Arguments and errors as for :func:`change_figure` (without ``annotate``).
    """
    _matplotlib()
    panels = _panels(records, experiment)
    return _figure(panels, ["values"] * len(panels))


def plot_values(
    records: pd.DataFrame,
    path: Union[str, Path],
    experiment: Optional[str] = None,
) -> Path:
    """Write :func:`values_figure` to ``path`` (the suffix picks the format); returns
    ``Path(path)``."""
    return _save(values_figure(records, experiment), path)


def _draw_values(ax: Any, panel: _Panel, narrow: bool) -> None:
    from matplotlib.lines import Line2D

    if panel.by_variant:
        _draw_values_by_variant(ax, panel, narrow)
        return
    _style(ax)
    xs = list(range(len(panel.rows)))
    series = []
    for name, label in panel.variants:
        cells = [panel.get(row, name) for row in panel.rows]
        pub = [_num(c.get("published")) for c in cells]
        series.append((name, label, cells, pub, any(not math.isnan(v) for v in pub)))
    slots = max(1, sum(2 if has_pub else 1 for *_, has_pub in series))
    group = 0.8 if len(xs) > 2 else min(0.8, 0.2 * slots)
    step = group / slots
    left = -group / 2 + step / 2
    handles: List[Any] = []
    largest = 0.0
    style = dict(markersize=4, elinewidth=0.8, capsize=2.0, linestyle="none", zorder=3)
    for k, (_name, label, cells, pub, has_pub) in enumerate(series):
        color = f"C{k}"
        sim = [_num(c.get("simulated")) for c in cells]
        sd = [_num(c.get("stdev")) for c in cells]
        largest = max([largest] + [abs(v) for v in sim + pub if not math.isnan(v)])
        ax.errorbar(
            [x + left for x in xs],
            sim,
            yerr=[0.0 if math.isnan(e) else e for e in sd],
            fmt="o",
            color=color,
            **style,
        )
        n = _ns([c.get("n") for c in cells])
        handles.append(
            Line2D(
                [],
                [],
                color=color,
                marker="o",
                linestyle="none",
                markersize=4,
                label=f"{label}: simulated, n = {n}" + ("" if has_pub else " (not published)"),
            )
        )
        left += step
        if has_pub:
            pub_sd = [_num(c.get("published_stdev")) for c in cells]
            ax.errorbar(
                [x + left for x in xs],
                pub,
                yerr=[0.0 if math.isnan(e) else e for e in pub_sd],
                fmt="D",
                color=color,
                markerfacecolor="white",
                **style,
            )
            note = "" if any(not math.isnan(e) for e in pub_sd) else " (no stdev given)"
            handles.append(
                Line2D(
                    [],
                    [],
                    color=color,
                    marker="D",
                    markerfacecolor="white",
                    linestyle="none",
                    markersize=4,
                    label=f"{label}: published{note}",
                )
            )
            left += step
    if len(series) > _MANY_SERIES:
        # Many variants: one legend entry per variant, and the two marker styles once.
        handles = [
            _marker(f"C{k}", f"{label} (n = {_ns([c.get('n') for c in cells])})")
            for k, (_name, label, cells, _pub, _has) in enumerate(series)
        ] + [_marker("0.3", "filled: simulated"), _marker("0.3", "open: published", "D")]
    _row_axis(ax, panel, 0.0 if len(xs) > 2 else 0.15)
    ax.set_ylim(bottom=0.0, top=largest * 1.12 if largest > 0 else 1.0)
    ax.set_ylabel(f"{panel.value_label()}\n{panel.better()}", fontsize=_FONT)
    ax.yaxis.set_major_formatter(_plain_formatter(largest))
    _legend(ax, handles, narrow, _MANY_LEGEND_COLUMNS if len(series) > _MANY_SERIES else 1)


def _marker(color: str, label: str, marker: str = "o") -> Any:
    """A legend entry: a filled circle (simulated) or an open diamond (published)."""
    from matplotlib.lines import Line2D

    open_ = {"markerfacecolor": "white"} if marker == "D" else {}
    return Line2D(
        [], [], color=color, marker=marker, linestyle="none", markersize=4, label=label, **open_
    )


class _VariantSeries:
    """One row of a by-variant table's panel: its simulated and published values per variant
    (in the panel's variant order) and where its markers sit in each variant's slot."""

    def __init__(self, panel: _Panel, row: Any, k: int) -> None:
        cells = [panel.get(row, name) for name, _ in panel.variants]
        self.row, self.color = row, f"C{k}"
        self.sim = [_num(c.get("simulated")) for c in cells]
        self.sd = [_num(c.get("stdev")) for c in cells]
        self.pub = [_num(c.get("published")) for c in cells]
        self.pub_sd = [_num(c.get("published_stdev")) for c in cells]
        self.n = _ns([c.get("n") for c in cells])
        self.has_pub = any(not math.isnan(v) for v in self.pub)
        self.sim_dx = self.pub_dx = 0.0


def _variant_series(panel: _Panel) -> Tuple[List[_VariantSeries], bool]:
    """The panel's series (a row each) with their offsets, and whether its axis is a log one:
    values spanning decades (seed 004's span three), on which a zero is not drawn."""
    series = [_VariantSeries(panel, row, k) for k, row in enumerate(panel.rows)]
    slots = max(1, sum(2 if s.has_pub else 1 for s in series))
    step = min(0.8, 0.24 * slots) / slots
    left = -step * (slots - 1) / 2
    for s in series:
        s.sim_dx, left = left, left + step
        if s.has_pub:
            s.pub_dx, left = left, left + step
    positive = [v for s in series for v in s.sim + s.pub if not math.isnan(v) and v > 0]
    log = bool(positive) and max(positive) / min(positive) > 30
    return series, log


def _foot_marks(panel: _Panel) -> List[Tuple[float, str, str]]:
    """What a by-variant panel writes at the foot of its axis, as (x, colour, text): "0" for
    a zero a log axis cannot show, "n/p" for a variant the paper did not publish."""
    series, log = _variant_series(panel)
    marks: List[Tuple[float, str, str]] = []
    for s in series:
        for x, (sim, pub) in enumerate(zip(s.sim, s.pub)):
            if log and not math.isnan(sim) and sim <= 0:
                marks.append((x + s.sim_dx, s.color, "0"))
            if s.has_pub and math.isnan(pub) and not math.isnan(sim):
                marks.append((x + s.pub_dx, "0.4", "n/p"))
            elif log and not math.isnan(pub) and pub <= 0:
                marks.append((x + s.pub_dx, s.color, "0"))
    return marks


def _draw_values_by_variant(ax: Any, panel: _Panel, narrow: bool) -> None:
    """A table with a line per variant (seed 004): the variants on the x axis, in the table's
    order, and a colour per row of the experiment (one row: the x label names it)."""
    from matplotlib.transforms import blended_transform_factory

    _style(ax)
    series, log = _variant_series(panel)
    xs = list(range(len(panel.variants)))
    style = dict(markersize=4, elinewidth=0.8, capsize=2.0, linestyle="none", zorder=3)
    key = str(panel.first.get("row_key") or "row")
    one_row = len(series) == 1
    handles: List[Any] = []

    def points(dx: float, values: List[float], errs: List[float], **how: Any) -> None:
        """One side's markers: a log axis drops values ≤ 0, a missing stdev draws no bar."""
        ax.errorbar(
            [x + dx for x in xs],
            [v if not (log and v <= 0) else math.nan for v in values],
            yerr=[0.0 if math.isnan(e) else e for e in errs],
            **how,
            **style,
        )

    for s in series:
        what = "" if one_row else f"{s.row}: "
        points(s.sim_dx, s.sim, s.sd, fmt="o", color=s.color)
        handles.append(_marker(s.color, f"{what}simulated, n = {s.n}"))
        if s.has_pub:
            points(s.pub_dx, s.pub, s.pub_sd, fmt="D", color=s.color, markerfacecolor="white")
            note = "" if any(not math.isnan(e) for e in s.pub_sd) else " (no stdev given)"
            handles.append(_marker(s.color, f"{what}published{note}", "D"))
    foot = blended_transform_factory(ax.transData, ax.transAxes)
    for x, color, text in _foot_marks(panel):
        ax.text(
            x,
            0.015,
            text,
            transform=foot,
            ha="center",
            va="bottom",
            fontsize=_SMALL - 1,
            color=color,
            rotation=90 if text == "n/p" else 0,
        )
    ax.set_xticks(xs)
    ax.set_xticklabels(
        [label for _, label in panel.variants], rotation=30, ha="right", rotation_mode="anchor"
    )
    ax.set_xlim(-0.6, len(xs) - 0.4)
    row = f" ({key} = {series[0].row})" if one_row and series else ""
    ax.set_xlabel(f"variant{row}", fontsize=_FONT)
    values = [v for s in series for v in s.sim + s.pub if not math.isnan(v)]
    if log:
        positive = [v for v in values if v > 0]
        ax.set_yscale("log")
        ax.set_ylim(bottom=min(positive) / 3, top=max(positive) * 2)
        ax.set_ylabel(f"{panel.value_label()}\n{panel.better()}, log scale", fontsize=_FONT)
    else:
        largest = max([0.0] + [abs(v) for v in values])
        ax.set_ylim(bottom=0.0, top=largest * 1.12 if largest > 0 else 1.0)
        ax.set_ylabel(f"{panel.value_label()}\n{panel.better()}", fontsize=_FONT)
        ax.yaxis.set_major_formatter(_plain_formatter(largest))
    _legend(ax, handles, narrow, _VARIANT_LEGEND_COLUMNS, None if one_row else key)


# --------------------------------------------------------------------------- entry points


def auto_kinds(records: pd.DataFrame, experiment: Optional[str] = None) -> Dict[str, str]:
    """The kind of figure ``"auto"`` draws for each experiment of ``records`` (name → kind):
    ``"values"`` for an experiment laid out ``variants_as_rows`` (its tables have a line per
    variant) or with more than :data:`AUTO_MAX_CHANGE_VARIANTS` non-baseline variants,
    ``"change"`` otherwise.

    Raises:
        ValueError: nothing to plot.
    """
    return {str(p.first.get("experiment")): p.auto_kind() for p in _panels(records, experiment)}


def figure(records: pd.DataFrame, kind: str = "change", experiment: Optional[str] = None) -> Any:
    """A ``kind`` figure of ``records``: :func:`change_figure`, :func:`values_figure`, or
    (``"auto"``) each experiment's panel as :func:`auto_kinds` chooses (in Jupyter, a cell
    ending in it shows the figure).

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: an unknown ``kind``, or nothing to plot.
    """
    if kind == "change":
        return change_figure(records, experiment)
    if kind == "values":
        return values_figure(records, experiment)
    if kind == AUTO:
        _matplotlib()
        panels = _panels(records, experiment)
        return _figure(panels, [p.auto_kind() for p in panels])
    raise ValueError(f"kind must be one of {', '.join(KINDS)} or {AUTO}, not {kind!r}")


def plot_records(
    records: pd.DataFrame,
    path: Union[str, Path],
    kind: str = "change",
    experiment: Optional[str] = None,
) -> Path:
    """Write :func:`figure` of ``records`` to ``path``: SVG or PDF (no date in the file) or
    PNG at :data:`PNG_DPI`, by suffix. Returns ``Path(path)``.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: an unknown ``kind``, or nothing to plot.
    """
    return _save(figure(records, kind, experiment), path)


def plot_experiment(
    records: pd.DataFrame,
    path: Union[str, Path],
    experiment: Optional[str] = None,
    kind: str = "change",
) -> Path:
    """:func:`plot_records` with the argument order of earlier releases."""
    return plot_records(records, path, kind=kind, experiment=experiment)
