"""The ``shootdown`` command: a thin typer + rich layer over :mod:`shootdown.api`.

Conventions:

* results go to stdout (or ``--out FILE``); progress bars and notes go to stderr, so a progress
  bar never mixes into the results, whatever the format. It appears only when stderr is a
  terminal and the work left spans more than one chunk of points;
* an experiment is a path or the name of a shipped one (``shootdown run seed002-madv-dontneed``;
  ``shootdown list`` shows them), from any directory;
* bad input — an unknown option, a missing file, an invalid experiment (``ConfigError``) —
  prints ONE line ``shootdown: error: ...`` on stderr and exits with status 2, never a
  traceback; so do outputs that could not be written (``--out`` into a missing directory,
  ``--parquet`` without pyarrow, ``--plot`` without matplotlib), before anything runs;
* ``check`` exits 0 when verified, 1 on a violation, 3 when the state bound was reached, 130
  when interrupted (Ctrl-C or SIGTERM: the search stops within a fraction of a second and
  says how many states it explored; nothing is proved).
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, List, NoReturn, Optional, Sequence

import typer
from typer.core import TyperGroup

try:  # recent typer releases ship their own copy of click; older ones use the click package
    from typer._click import exceptions as click_exc  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    from click import exceptions as click_exc  # type: ignore[no-redef]

from . import api, paths, profiling, records, report
from ._bridge import ConfigError, HostError, NativeUnavailableError
from ._version import __version__
from .calibrate import DEFAULT_PROFILE
from .sweep import parse_grid, summarize_sweep
from .sweep import sweep as run_sweep

__all__ = [
    "app",
    "main",
    "EXIT_OK",
    "EXIT_VIOLATION",
    "EXIT_USAGE",
    "EXIT_BOUND",
    "EXIT_INTERRUPTED",
    "EXIT_UNREACHED",
]

EXIT_OK = 0
EXIT_VIOLATION = 1
EXIT_USAGE = 2
EXIT_BOUND = 3
EXIT_UNREACHED = 4
EXIT_INTERRUPTED = 130

_PROG = "shootdown"


def _one_line(message: str) -> str:
    return " ".join(str(message).split()) or "unknown error"


def _note(message: str) -> None:
    """A line on stderr (notes, warnings): never mixed into the results on stdout."""
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()


def _fail(message: str) -> NoReturn:
    _note(f"{_PROG}: error: {_one_line(message)}")
    sys.exit(EXIT_USAGE)


class _OneLineErrors(TyperGroup):
    """Runs the command group and turns every input error into one stderr line + exit 2."""

    def main(  # type: ignore[override]
        self,
        args: Optional[Sequence[str]] = None,
        prog_name: Optional[str] = None,
        complete_var: Optional[str] = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        no_args_error = getattr(click_exc, "NoArgsIsHelpError", None)
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name or _PROG,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except click_exc.UsageError as exc:
            if no_args_error is not None and isinstance(exc, no_args_error) and exc.ctx is not None:
                typer.echo(exc.ctx.get_help())
                sys.exit(EXIT_OK)
            _fail(exc.format_message())
        except click_exc.ClickException as exc:
            _fail(exc.format_message())
        except typer.Abort:
            _note(f"{_PROG}: aborted")
            sys.exit(130)
        except (ConfigError, HostError, NativeUnavailableError, paths.DataNotFoundError) as exc:
            _fail(str(exc))
        except ImportError as exc:  # an optional dependency (pyarrow, matplotlib, ray)
            _fail(str(exc))
        except OSError as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            _fail(f"{where}{exc.strerror or exc}")
        code = rv if isinstance(rv, int) else EXIT_OK
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=_OneLineErrors,
    name=_PROG,
    help="Simulate and model-check x86 Linux TLB shootdowns.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class OutFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class TextFormat(str, Enum):
    text = "text"
    json = "json"


class MemoryModel(str, Enum):
    sc = "sc"
    tso = "tso"


class Strategy(str, Enum):
    auto = "auto"
    bfs = "bfs"
    dfs = "dfs"
    parallel = "parallel"
    random = "random"
    pct = "pct"


class Backend(str, Enum):
    local = "local"
    ray = "ray"


class ListKind(str, Enum):
    experiments = "experiments"
    profiles = "profiles"
    scenarios = "scenarios"


_EXPERIMENT_HELP = "Experiment file (TOML), or a shipped experiment's name (shootdown list)."


# --------------------------------------------------------------------------- helpers


class _LazyBar:
    """A rich progress bar on stderr, started only when the work left (``total - done`` at the
    first call: a sweep's cached points are done already) spans more than one chunk."""

    def __init__(self, chunk: int, description: str) -> None:
        self.chunk, self.description = chunk, description
        self.progress: Any = None
        self.task: Any = None
        self.decided = False

    def __call__(self, done: int, total: int) -> None:
        if not self.decided:
            self.decided = True
            if total - done > self.chunk:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )

                self.progress = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("points"),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=Console(stderr=True),
                    transient=True,
                )
                self.progress.start()
                self.task = self.progress.add_task(self.description, total=total)
        if self.progress is not None:
            self.progress.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


@contextmanager
def _progress(
    enabled: bool, threads: Optional[int], description: str
) -> Iterator[Optional[_LazyBar]]:
    if not (enabled and sys.stderr.isatty()):
        yield None
        return
    bar = _LazyBar(2 * (threads or api.default_threads()), description)
    try:
        yield bar
    finally:
        bar.close()


@contextmanager
def _on_interrupt(kept: str) -> Iterator[None]:
    """Ctrl-C (or SIGTERM) inside: one line saying what was kept, then exit 130."""
    try:
        yield
    except (KeyboardInterrupt, typer.Abort):
        _note(f"{_PROG}: interrupted: {kept}")
        sys.exit(EXIT_INTERRUPTED)


_NOTHING_KEPT = "no output was written and nothing is cached (`shootdown sweep` caches points)"


def _emit(text: str, out: Optional[Path]) -> None:
    if not text.endswith("\n"):
        text += "\n"
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        out.write_text(text, encoding="utf-8")
        _note(f"wrote {out}")


def _check_outputs(
    out: Optional[Path] = None,
    parquet: Optional[Path] = None,
    plot: Optional[Path] = None,
    trace_out: Optional[Path] = None,
) -> None:
    """Fail before running, not after: every output's directory exists, and the extras an
    output needs are installed."""
    import importlib.util

    for option, path in (
        ("--out", out),
        ("--parquet", parquet),
        ("--plot", plot),
        ("--trace", trace_out),
    ):
        if path is not None and not path.resolve().parent.is_dir():
            raise ConfigError(
                f"{path}: {option}: directory {path.parent} does not exist "
                f"(create it first: mkdir -p {path.parent})"
            )
    if parquet is not None and importlib.util.find_spec("pyarrow") is None:
        raise ConfigError(
            f"{parquet}: --parquet: writing Parquet needs pyarrow: pip install 'shootdown[parquet]'"
        )
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            f"{plot}: --plot: plotting needs matplotlib: pip install 'shootdown[plot]'"
        )


def _render(frame: Any, fmt: OutFormat, table: str) -> str:
    if fmt is OutFormat.json:
        return records.to_json(frame)
    if fmt is OutFormat.csv:
        return report.to_csv(frame) or ""
    return table


def _warn_violations(frame: Any) -> None:
    if "violations" not in frame or not len(frame):
        return
    col = frame["violations"]
    total = int(sum(len(v) if isinstance(v, list) else int(v or 0) for v in col))
    if total:
        _note(f"{_PROG}: warning: {total} invariant violation(s) in simulated runs")


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"shootdown {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """Simulate and model-check x86 Linux TLB shootdowns."""


# --------------------------------------------------------------------------- commands


@app.command()
def reproduce(
    ids: Optional[List[str]] = typer.Argument(
        None, metavar="[ID]...", help="Seed ids (000) or experiment names; default all."
    ),
    quick: bool = typer.Option(False, "--quick", help="Quick configuration (fewer rows/reps)."),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Output format."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write here instead of stdout."),
    threads: Optional[int] = typer.Option(None, "--threads", "-j", min=1, help="Worker threads."),
) -> None:
    """Run the seed experiments and compare with the published numbers.

    Exit status is 0 even when directions mismatch: the table marks them.
    """
    _check_outputs(out=out)
    with _on_interrupt(_NOTHING_KEPT), _progress(True, threads, "reproduce") as bar:
        frame = api.reproduce(ids or None, quick=quick, threads=threads, progress=bar)
    _emit(_render(frame, fmt, report.format_table(frame)), out)
    _warn_violations(frame)


@app.command()
def run(
    file: Path = typer.Argument(..., help=_EXPERIMENT_HELP),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", "-s", metavar="KEY=VALUE", help="Override a key (TOML value); repeatable."
    ),
    quick: bool = typer.Option(False, "--quick", help="Quick configuration."),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Output format."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write here instead of stdout."),
    threads: Optional[int] = typer.Option(None, "--threads", "-j", min=1, help="Worker threads."),
    points: bool = typer.Option(
        False,
        "--points",
        help="Output one row per simulated run (with counters) instead of records.",
    ),
    trace_out: Optional[Path] = typer.Option(
        None,
        "--trace",
        metavar="OUT.json",
        help="Also write a Perfetto trace of the first row, baseline variant.",
    ),
    parquet: Optional[Path] = typer.Option(
        None, "--parquet", metavar="OUT", help="Also write the per-run points as Parquet."
    ),
    plot: Optional[Path] = typer.Option(
        None,
        "--plot",
        metavar="FIG",
        help="Also draw the change vs the baseline, simulated beside published "
        "(.svg, .pdf or .png; see `shootdown plot`).",
    ),
) -> None:
    """Run one experiment file and print its table (or JSON/CSV)."""
    set_list = list(sets or [])
    _check_outputs(out=out, parquet=parquet, plot=plot, trace_out=trace_out)
    if plot is not None:
        from .plot import check_figure_path

        check_figure_path(plot, "--plot")
    with _on_interrupt(_NOTHING_KEPT), _progress(True, threads, file.name) as bar:
        pts = api.run(file, set_list, quick=quick, threads=threads, progress=bar)
    recs = api.to_records(pts)
    if points:
        frame = pts
        table = report.format_points(pts)
    else:
        frame = recs
        table = report.format_table(recs)
    _emit(_render(frame, fmt, table), out)
    if parquet is not None:
        report.to_parquet(pts, parquet)
        _note(f"wrote {parquet}")
    if plot is not None:
        from .plot import plot_records

        plot_records(recs, plot)
        _note(f"wrote {plot}")
    if trace_out is not None:
        api.trace(file, trace_out, sets=set_list, quick=quick)
        _note(f"wrote {trace_out}")
    _warn_violations(recs)


@app.command()
def check(
    scenario: Optional[str] = typer.Argument(
        None, help="Scenario file, or a name in <data>/scenarios/."
    ),
    list_: bool = typer.Option(False, "--list", help="List scenarios and mutants."),
    mutant: Optional[str] = typer.Option(
        None, "--mutant", help="Check a named mutant (historical bug)."
    ),
    memory_model: MemoryModel = typer.Option(
        MemoryModel.sc, "--memory-model", help="Memory model."
    ),
    max_states: Optional[int] = typer.Option(
        None,
        "--max-states",
        min=1,
        help=(
            "State bound (default: a quarter of the available memory, at about 40 B a state"
            " depth-first and 173 B breadth-first)."
        ),
    ),
    sample: Optional[int] = typer.Option(
        None, "--sample", min=1, help="Sample N schedules instead of exploring all."
    ),
    seed: int = typer.Option(0, "--seed", help="RNG seed for sampling."),
    strategy: Optional[Strategy] = typer.Option(
        None,
        "--strategy",
        help=(
            "auto (the default without --sample: dfs, then parallel for a shortest"
            " counterexample if it finds a violation), dfs (depth-first on every core,"
            " fingerprints only: the least memory), parallel (breadth-first on every core:"
            " shortest counterexamples), bfs (the same on one thread), random or pct (the"
            " default with --sample: random). The exhaustive ones find the same on any core"
            " count."
        ),
    ),
    no_symmetry: bool = typer.Option(
        False, "--no-symmetry", help="Do not reduce by the scenario's symmetric CPU groups."
    ),
    sets: Optional[List[str]] = typer.Option(
        None,
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help=(
            "Override a scenario key (options.smp_call=concurrent, mms.0.map.0.npages=4);"
            " cpus=N grows the scenario with copies of its last CPU's role."
        ),
    ),
    fmt: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="Output format."),
) -> None:
    """Model-check a scenario (exit 0 verified, 1 violation, 3 bound reached, 4 unreached)."""
    if list_:
        listing = api.check_list()
        text = (
            json.dumps(listing, indent=2, ensure_ascii=False)
            if fmt is TextFormat.json
            else report.format_check_list(listing)
        )
        _emit(text, None)
        return
    if scenario is None:
        raise click_exc.UsageError("missing argument SCENARIO (or use --list)")
    result = api.check(
        scenario,
        mutant=mutant,
        memory_model=memory_model.value,
        max_states=max_states,
        sample=sample,
        seed=seed,
        strategy=None if strategy is None else strategy.value,
        progress=sys.stderr.isatty(),
        symmetry=not no_symmetry,
        sets=sets or [],
    )
    text = (
        json.dumps(result, indent=2, ensure_ascii=False)
        if fmt is TextFormat.json
        else report.format_check(result)
    )
    _emit(text, None)
    verdict = result.get("verdict")
    if verdict == "interrupted":
        _note(f"{_PROG}: interrupted after {result.get('states', 0)} states: nothing was proved")
        raise typer.Exit(EXIT_INTERRUPTED)
    if verdict == "violation":
        raise typer.Exit(EXIT_VIOLATION)
    if verdict == "bound-reached":
        raise typer.Exit(EXIT_BOUND)
    if verdict == "unreached":
        raise typer.Exit(EXIT_UNREACHED)


@app.command()
def bench(
    file: Path = typer.Argument(..., help=_EXPERIMENT_HELP),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", "-s", metavar="KEY=VALUE", help="Override a key."
    ),
    quick: bool = typer.Option(False, "--quick", help="Quick configuration."),
    fmt: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="Output format."),
) -> None:
    """Time one run of the experiment's first point: steps/s and simulated s per wall s."""
    result = api.bench(file, list(sets or []), quick=quick)
    _emit(json.dumps(result) if fmt is TextFormat.json else report.format_bench(result), None)


@app.command("list")
def list_(
    kind: Optional[ListKind] = typer.Argument(
        None, help="experiments, profiles or scenarios (default: all three)."
    ),
    fmt: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="Output format."),
) -> None:
    """List the shipped experiments, machine profiles and checker scenarios, one line each.

    Reads the data files only (works without the native module). Any command that takes an
    experiment file also takes the NAME shown here.
    """
    kinds = [kind.value] if kind is not None else list(paths.LIST_KINDS)
    listers = {
        "experiments": paths.list_experiments,
        "profiles": paths.list_profiles,
        "scenarios": paths.list_scenarios,
    }
    entries = [e for k in kinds for e in listers[k]()]
    if fmt is TextFormat.json:
        _emit(json.dumps(entries, indent=2, ensure_ascii=False), None)
        return
    width = None
    if sys.stdout.isatty():
        import shutil

        width = shutil.get_terminal_size().columns
    _emit(report.format_listing(entries, kinds, width=width), None)


def _grid_json_value(value: Any) -> Any:
    """A grid value (TOML text) as a JSON value: parsed when it is TOML, else the text."""
    from .paths import tomllib

    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except (tomllib.TOMLDecodeError, TypeError):
        return str(value)
    try:
        json.dumps(parsed)
    except (TypeError, ValueError):  # dates and times
        return str(value)
    return parsed


@app.command("sweep")
def sweep_(
    file: Path = typer.Argument(..., help=_EXPERIMENT_HELP),
    grids: Optional[List[str]] = typer.Option(
        None,
        "--grid",
        "-g",
        metavar="KEY=V1,V2",
        help="Sweep a key over TOML values split at top-level commas ([8,16],[32] is two); "
        "repeatable: every combination runs.",
    ),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", "-s", metavar="KEY=VALUE", help="Override a key (TOML value); repeatable."
    ),
    quick: bool = typer.Option(False, "--quick", help="Quick configuration."),
    backend: Backend = typer.Option(
        Backend.local, "--backend", help="local (threads) or ray (see --address)."
    ),
    address: Optional[str] = typer.Option(
        None,
        "--address",
        metavar="HOST:PORT",
        help="With --backend ray: the Ray cluster (host:port, auto, ray://…); default "
        "$RAY_ADDRESS, else a private local instance. Auth as Ray reads it (RAY_AUTH_MODE, "
        "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH).",
    ),
    cache: Path = typer.Option(
        Path(".shootdown-cache"), "--cache", metavar="DIR", help="Point cache (resumes sweeps)."
    ),
    threads: Optional[int] = typer.Option(
        None, "--threads", "-j", min=1, help="Worker threads (ray: per task)."
    ),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Output format."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write here instead of stdout."),
) -> None:
    """Run an experiment over every combination of --grid values, caching every point.

    Points already in the cache (same files, overrides, quick flag and build) are not run
    again, so an interrupted or enlarged sweep resumes. Prints avg (stdev) and the change
    against the baseline variant per combination, row and variant.
    """
    _check_outputs(out=out)
    if address is not None and backend is not Backend.ray:
        raise click_exc.UsageError("--address names a Ray cluster: use it with --backend ray")
    grid = parse_grid(list(grids or []))
    kept = f"the points finished so far are cached in {cache}; the same command resumes from them"
    with _on_interrupt(kept), _progress(True, threads, f"sweep {file.stem}") as bar:
        frame = run_sweep(
            file,
            grid,
            backend=backend.value,
            cache_dir=cache,
            sets=list(sets or []),
            quick=quick,
            threads=threads,
            progress=bar,
            address=address,
        )
    cached = int(frame["cached"].sum()) if len(frame) else 0
    _note(f"{cached} of {len(frame)} points from the cache in {cache}")
    summary = summarize_sweep(frame)
    if fmt is OutFormat.json:
        shown = summary.copy()
        for key in grid:
            shown[key] = [_grid_json_value(v) for v in shown[key]]
        text = records.to_json(shown)
    elif fmt is OutFormat.csv:
        text = report.to_csv(summary) or ""
    else:
        plans = frame.attrs.get("plans") or {}
        first = next(iter(plans.values()), None)
        row_key = (first["experiment"].get("row_key") if first else None) or "row"
        title = _sweep_title(plans, grid, quick, list(sets or []))
        text = report.format_sweep(summary, title, row_key=row_key)
    _emit(text, out)
    _warn_violations(summary)


def _sweep_title(plans: Any, grid: Any, quick: bool, sets: Sequence[str] = ()) -> str:
    """``seed 000 · TITLE · UNIT · N combinations (shape)[ · quick][ (modified: --set …)]``:
    like ``run``'s title, a ``--set`` that changes the configuration is named, since the
    experiment's title and variant labels describe the unmodified one."""
    from .provenance import modifying_sets

    first = next(iter(plans.values()), None)
    if first is None:
        return ""
    exp = first["experiment"]
    ident = f"seed {exp['seed']}" if exp.get("seed") else str(exp.get("name", ""))
    combos = len(plans)
    shape = " × ".join(str(len(v)) for v in grid.values()) if grid else "no grid"
    parts = [ident, exp.get("title") or "", exp.get("unit") or ""]
    parts.append(f"{combos} combination{'' if combos == 1 else 's'} ({shape})")
    if quick:
        parts.append("quick")
    title = " · ".join(p for p in parts if p)
    changes = modifying_sets(list(sets))
    if changes:
        title += " (modified: " + ", ".join(f"--set {c}" for c in changes) + ")"
    return title


@app.command()
def trace(
    file: Path = typer.Argument(..., help=_EXPERIMENT_HELP),
    out: Path = typer.Option(..., "--out", "-o", metavar="OUT.json", help="Trace file to write."),
    row: Optional[str] = typer.Option(None, "--row", help="Row value (default: first row)."),
    variant: Optional[str] = typer.Option(
        None, "--variant", help="Variant name or label (default: baseline)."
    ),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", "-s", metavar="KEY=VALUE", help="Override a key."
    ),
    quick: bool = typer.Option(False, "--quick", help="Quick configuration."),
    duration: float = typer.Option(
        api.TRACE_DURATION_MS,
        "--duration",
        metavar="MS",
        help="Simulated milliseconds to trace (the run stops at the window's end).",
    ),
    from_ms: Optional[float] = typer.Option(
        None,
        "--from",
        metavar="MS",
        help="Start the window here (simulated ms). Default: just before the workload's "
        "first shootdown (first IPI or kvm_flush_remote_tlbs).",
    ),
) -> None:
    """Write a Chrome/Perfetto trace (JSON) of a window of one run.

    By default the window starts just before the workload's first shootdown, so the IPIs,
    flush handlers and waits are in it; every slice is closed at the window's end and every
    IPI is one arrow (flow) from its sender to the CPU that took it.
    """
    _check_outputs(out=out)
    written = api.trace(
        file,
        out,
        row=row,
        variant=variant,
        sets=list(sets or []),
        quick=quick,
        duration_ms=duration,
        from_ms=from_ms,
    )
    _note(f"wrote {written} (open in https://ui.perfetto.dev)")


@app.command()
def profile(
    file: Path = typer.Argument(..., help=_EXPERIMENT_HELP),
    row: Optional[str] = typer.Option(None, "--row", help="Row value (default: first row)."),
    variants: Optional[List[str]] = typer.Option(
        None, "--variant", help="Variant name or label; repeatable (default: all)."
    ),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", "-s", metavar="KEY=VALUE", help="Override a key (TOML value); repeatable."
    ),
    quick: bool = typer.Option(False, "--quick", help="Quick configuration."),
    top: int = typer.Option(15, "--top", min=1, help="Show the N functions that changed most."),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Output format."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write here instead of stdout."),
    threads: Optional[int] = typer.Option(None, "--threads", "-j", min=1, help="Worker threads."),
) -> None:
    """Where each variant's CPU time goes, per kernel function, per workload event.

    Runs every repetition of one row and compares the variants function by function
    (exclusive time per event, calls per event, inclusive time per call).
    """
    _check_outputs(out=out)
    frame = api.profile(
        file,
        row=row,
        variants=variants or None,
        sets=list(sets or []),
        quick=quick,
        threads=threads,
    )
    summary = profiling.summarize_profile(frame)
    if fmt is OutFormat.table:
        the_plan = frame.attrs["plan"]
        exp = the_plan["experiment"]
        shown_row = frame["row"].iloc[0] if len(frame) else row
        title = f"{exp.get('title') or exp['name']} · {exp.get('row_key') or 'row'} = {shown_row}"
        reps = frame.drop_duplicates(["variant", "rep"]).groupby("variant").size()
        title += f" · {int(reps.max()) if len(reps) else 0} repetition(s) per variant"
        _emit(profiling.format_profile(summary, title, top=top), out)
    elif fmt is OutFormat.json:
        _emit(summary.to_json(orient="records", force_ascii=False), out)
    else:
        _emit(summary.to_csv(index=False), out)


class PlotKind(str, Enum):
    auto = "auto"
    change = "change"
    values = "values"


def _plot_targets(targets: Sequence[str], quick: bool) -> tuple[list[str], list[str]]:
    """Split ``plot``'s arguments into seed ids/names (run like ``reproduce``) and experiment
    files or shipped experiment names (run like ``run``)."""
    ids: List[str] = []
    files: List[str] = []
    try:
        seeds = api.seed_experiments(None, quick) if targets else []
    except paths.DataNotFoundError:
        seeds = []
    for target in targets:
        as_path = Path(target)
        if target.endswith(".toml") or "/" in target or as_path.is_file():
            files.append(target)
        elif any(api._matches(the_plan, file, target) for file, the_plan in seeds):
            ids.append(target)
        else:
            files.append(target)  # a shipped experiment's name, or a one-line error
    return ids, files


def _filter_records(frame: Any, wanted: Sequence[str], source: Path) -> Any:
    """The records of ``frame`` whose seed or experiment is in ``wanted`` (all if empty)."""
    if not wanted:
        return frame
    for ident in wanted:
        if not ((frame["seed"] == ident) | (frame["experiment"] == ident)).any():
            raise ConfigError(f"{source}: {ident}: no records of this seed or experiment")
    keep = frame["seed"].isin(list(wanted)) | frame["experiment"].isin(list(wanted))
    return frame[keep].reset_index(drop=True)


@app.command("plot")
def plot_(
    targets: Optional[List[str]] = typer.Argument(
        None,
        metavar="[ID|FILE]...",
        help="Seed ids (002) or names, experiment files or shipped experiment names; default "
        "all seeds. With --from-json: which seeds or experiments of the file to draw.",
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", metavar="FIG", help="Figure to write: .svg, .pdf or .png (300 dpi)."
    ),
    kind: PlotKind = typer.Option(
        PlotKind.auto,
        "--kind",
        help="change: before→after change % per row, simulated beside published, ±1 SE; "
        "values: absolute means ±1 stdev; auto: per experiment, values for a table of many "
        "variants (layout variants_as_rows, or more than 4 besides the baseline), else change.",
    ),
    from_json: Optional[Path] = typer.Option(
        None,
        "--from-json",
        metavar="RECORDS.json",
        help="Draw records written by `reproduce --format json` or `run --format json` "
        "instead of running, or a validation (`validate --format json`): real vs simulated "
        "against the number of siblings.",
    ),
    sets: Optional[List[str]] = typer.Option(
        None,
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="Override a key of every experiment FILE (TOML value); repeatable.",
    ),
    quick: bool = typer.Option(False, "--quick", help="Quick configuration."),
    threads: Optional[int] = typer.Option(None, "--threads", "-j", min=1, help="Worker threads."),
) -> None:
    """Draw the seeds' claim: the change % of each variant vs the baseline, per row.

    One panel per experiment, the simulated change beside the published one, error bars
    ±1 standard error of the difference of the means (the caption says how); an experiment
    of many variants (seed 004) is drawn as its values instead unless --kind says otherwise.
    Runs the experiments first (like `reproduce` for seed ids, like `run` for files) unless
    --from-json gives records written earlier.
    """
    from .plot import check_figure_path, load_records, plot_records

    check_figure_path(out, "--out")
    wanted = list(targets or [])
    from .validation_plot import is_validation_document, load_validation, plot_validation

    if from_json is not None and is_validation_document(from_json):
        if wanted or sets or quick or threads is not None:
            raise click_exc.UsageError(
                "a validation document (validate --format json) is drawn whole: no targets, "
                "--set, --quick or --threads"
            )
        plot_validation(load_validation(from_json), out)
        _note(f"wrote {out}")
        return
    if from_json is not None:
        if sets or quick or threads is not None:
            raise click_exc.UsageError(
                "--from-json draws records already computed: --set, --quick and --threads "
                "do not apply"
            )
        frame = _filter_records(load_records(from_json), wanted, from_json)
    else:
        ids, files = _plot_targets(wanted, quick)
        if sets and not files:
            raise click_exc.UsageError("--set applies to experiment files (plot FILE --set ...)")
        frames = []
        if ids or not files:
            with _progress(True, threads, "reproduce") as bar:
                frames.append(
                    api.reproduce(ids or None, quick=quick, threads=threads, progress=bar)
                )
        for file in files:
            with _progress(True, threads, Path(file).name) as bar:
                pts = api.run(file, list(sets or []), quick=quick, threads=threads, progress=bar)
            frames.append(api.to_records(pts))
        frame = records.concat_records(frames)
        _warn_violations(frame)
    if not len(frame):
        raise ConfigError(f"{from_json or 'plot'}: no records to draw")
    plot_records(frame, out, kind=kind.value)
    _note(f"wrote {out}")


class _CaseBar:
    """A rich progress bar over measured cases (stderr, terminals only)."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.progress: Any = None
        self.task: Any = None

    def __call__(self, name: str, done: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        if self.progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.progress = Progress(
                TextColumn(self.description),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[case]}"),
                console=Console(stderr=True),
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.description, total=total, case="")
        self.progress.update(self.task, completed=done, total=total, case=name)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


@contextmanager
def _case_bar(description: str) -> Iterator[_CaseBar]:
    """The bar of measured cases; Ctrl-C says nothing was written (the profile or table is
    written only at the end)."""
    bar = _CaseBar(description)
    with _on_interrupt("nothing was written"):
        try:
            yield bar
        finally:
            bar.close()


@app.command()
def calibrate(
    out: Path = typer.Option(DEFAULT_PROFILE, "--out", "-o", help="The profile to write (TOML)."),
    reps: int = typer.Option(5, "--reps", min=3, max=1000, help="Timed repetitions per case."),
    target_ms: float = typer.Option(
        30.0, "--target-ms", min=1.0, max=10000.0, help="Wall time of one repetition, ms."
    ),
) -> None:
    """Measure this machine's primitives and madvise with 0 and 1 busy sibling; fit a profile.

    Writes a profile TOML (a `[machine]` table describing this host, and the fitted costs, each
    naming the measurement it came from). `shootdown validate --profile FILE` then predicts
    every other case and compares.
    """
    from . import calibrate as cal_mod

    _check_outputs(out=out)
    with _case_bar("calibrate") as bar:
        cal = cal_mod.calibrate(out, reps=reps, target_ms=target_ms, progress=bar)
    for w in cal.warnings:
        _note(f"{_PROG}: warning: {w}")
    lines = [f"{'cost':<24} {'ns':>10}  from"]
    for key, c in cal.costs.items():
        lines.append(f"{key:<24} {c.value:>10.1f}  {', '.join(c.fitted) or 'assumed'}")
    scales = ", ".join(f"{k} × {v:.3f}" for k, v in cal.scales.items())
    lines.append(f"scales over the base profile {cal.base}: {scales}")
    _emit("\n".join(lines), None)
    _note(f"wrote {out}")


@app.command()
def validate(
    profile_file: Path = typer.Option(
        DEFAULT_PROFILE, "--profile", "-p", help="Calibrated profile (calibrate --out)."
    ),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Output format."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write here instead of stdout."),
    reps: int = typer.Option(5, "--reps", min=3, max=1000, help="Timed repetitions per case."),
    target_ms: float = typer.Option(
        30.0, "--target-ms", min=1.0, max=10000.0, help="Wall time of one repetition, ms."
    ),
) -> None:
    """Run every shootdown case for real and in the model; print real | simulated | error.

    Cases: madvise of 1 and 32 pages, an mprotect pair over 8 pages, munmap of a 2 MiB region,
    each with T = 0 … CPUs-1 siblings, busy and sleeping. Cells marked * are the calibration's
    inputs; every other cell is a prediction.
    """
    from . import hostcases, twin
    from . import validate as val

    _check_outputs(out=out)
    profile = twin.load_profile_file(profile_file)
    machine = twin.machine_of(profile, profile_file)
    host = hostcases.probe()
    hostcases.online_cpus(host)  # at least two, before anything else is said
    other = val.host_mismatch(machine, host)
    if other:
        _note(f"{_PROG}: warning: {profile_file} was calibrated on another machine ({other})")
    with _case_bar("validate") as bar:
        frame = val.validate(profile_file, reps=reps, target_ms=target_ms, progress=bar, host=host)
    for w in frame.attrs.get("warnings", []):
        _note(f"{_PROG}: warning: {w}")
    if fmt is OutFormat.json:
        doc = {
            "kind": "validation",
            "profile": str(profile_file),
            "host": host,
            "summary": val.summary(frame),
            "cases": json.loads(frame.to_json(orient="records")),
        }
        text = json.dumps(doc, indent=1)
    elif fmt is OutFormat.csv:
        text = frame.to_csv(index=False)
    else:
        text = val.format_table(frame)
    _emit(text, out)


@app.command()
def info() -> None:
    """Print the version, the data directory and whether the native module loads."""
    try:
        root: str = str(paths.data_root())
    except paths.DataNotFoundError as exc:
        root = f"not found ({exc})"
    try:
        from ._bridge import native

        native()
        native_state = "loaded"
    except NativeUnavailableError as exc:
        native_state = f"unavailable ({exc})"
    typer.echo(f"shootdown {__version__}\ndata: {root}\nnative: {native_state}")


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console-script entry point (``shootdown``). SIGTERM is handled as Ctrl-C is: a search
    or a measurement stops and says so; nothing half-done is written."""
    import signal

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    app(args=list(argv) if argv is not None else None, prog_name=_PROG)


if __name__ == "__main__":  # pragma: no cover
    main()
