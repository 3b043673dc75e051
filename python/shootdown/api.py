"""The user-facing Python API: plan, run, summarize, reproduce, check, trace, profile, bench.

Every function is a thin layer over ``shootdown._native`` (Rust). Simulation results are
deterministic: they depend on the experiment file, its ``--set`` overrides, the profile, the
point's seed and the package version — never on ``threads``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import pandas as pd

from . import paths, profiling
from ._bridge import ConfigError, call, native
from .records import (
    build_records,
    concat_records,
    empty_records,
    points_frame,
    row_key,
    summarize,
)
from .schema import BenchResult, CheckResult, Plan, PointResult, ScenarioInfo

__all__ = [
    "PathLike",
    "ProgressCallback",
    "default_threads",
    "plan",
    "run",
    "run_plan",
    "to_records",
    "summarize",
    "seed_experiments",
    "reproduce",
    "check",
    "check_list",
    "trace",
    "profile",
    "bench",
]

PathLike = Union[str, "os.PathLike[str]"]

#: ``progress(done, total)``: called with the number of points finished so far and the total,
#: once before the first chunk and after every chunk.
ProgressCallback = Callable[[int, int], None]


_U64_MAX = 2**64 - 1
#: Simulated time a trace covers by default, in ms.
TRACE_DURATION_MS = 2.0
MAX_THREADS = 65536


def _int_option(source: Any, option: str, value: Any, low: int, high: int = _U64_MAX) -> int:
    """``value`` as an int in ``[low, high]``, else a one-line :class:`ConfigError` naming
    ``source`` and ``option`` (never an ``OverflowError`` from the native layer)."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            ok = not isinstance(value, bool) and float(value).is_integer()
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"{source}: {option}: expected an integer (got {value!r})")
        value = int(value)
    if not low <= value <= high:
        raise ConfigError(
            f"{source}: {option}: must be an integer between {low} and {high} (got {value})"
        )
    return value


def _threads(source: Any, threads: Optional[int]) -> int:
    if threads is None or threads == 0:
        return default_threads()
    return _int_option(source, "threads", threads, 1, MAX_THREADS)


def default_threads() -> int:
    """Worker threads used when ``threads=None``: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))  # type: ignore[attr-defined]
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _experiment_file(path: PathLike) -> str:
    """The experiment file ``path`` names: a path, or a shipped experiment's name
    (:func:`shootdown.paths.resolve_experiment`)."""
    return str(paths.resolve_experiment(path))


def _sets(sets: Iterable[str]) -> List[str]:
    if isinstance(sets, str):
        return [sets]
    return [str(s) for s in sets]


def plan(path: PathLike, sets: Sequence[str] = (), quick: bool = False) -> Plan:
    """Load an experiment and expand it into points, without running anything.

    Args:
        path: the experiment file (``experiments/**/*.toml``), or the name of a shipped
            experiment (its file stem, e.g. ``"seed002-madv-dontneed"``; see
            :func:`shootdown.paths.resolve_experiment`).
        sets: ``KEY=VALUE`` overrides (dotted key, TOML value), e.g. ``"experiment.rows=[8]"``.
        quick: use the experiment's ``quick_*`` rows, repetitions and ``[quick.*]`` overrides.

    Returns:
        The plan (see :class:`shootdown.schema.Plan`); ``variants[0]`` is the baseline. Its
        ``sets`` are the overrides applied and its ``quick`` the flag, so the frames built
        from it carry their provenance (:mod:`shootdown.provenance`).

    Raises:
        ConfigError: the file, a key or a value is invalid (message ``FILE: KEY: REASON``), or
            ``path`` names no file and no shipped experiment.
    """
    set_list = _sets(sets)
    the_plan: Plan = call("plan", _experiment_file(path), set_list, bool(quick))
    if not isinstance(the_plan.get("sets"), list):  # a native module that does not say
        the_plan["sets"] = list(set_list)
    the_plan["quick"] = bool(quick)
    return the_plan


def _run_indices(
    path: str,
    sets: List[str],
    quick: bool,
    indices: Sequence[int],
    threads: int,
    advance: Callable[[int], None],
) -> List[PointResult]:
    """Run points in chunks of about ``2 × threads`` so progress can advance between chunks."""
    chunk = max(1, 2 * threads)
    results: List[PointResult] = []
    for start in range(0, len(indices), chunk):
        part = [int(i) for i in indices[start : start + chunk]]
        results.extend(call("run_points", path, sets, quick, part, threads))
        advance(len(part))
    return results


class _Progress:
    """Counts finished points across several experiments and reports to a callback."""

    def __init__(self, total: int, callback: Optional[ProgressCallback]) -> None:
        self.total, self.done, self.callback = total, 0, callback
        if callback is not None:
            callback(0, total)

    def advance(self, n: int) -> None:
        self.done += n
        if self.callback is not None:
            self.callback(self.done, self.total)


def run_plan(
    path: PathLike,
    the_plan: Plan,
    sets: Sequence[str] = (),
    quick: bool = False,
    threads: Optional[int] = None,
    progress: Optional[ProgressCallback] = None,
    indices: Optional[Sequence[int]] = None,
) -> pd.DataFrame:
    """Run (some of) the points of an already computed plan; see :func:`run`."""
    threads = _threads(path, threads)
    wanted = [p["index"] for p in the_plan["points"]] if indices is None else list(indices)
    tracker = _Progress(len(wanted), progress)
    results = _run_indices(
        _experiment_file(path), _sets(sets), bool(quick), wanted, threads, tracker.advance
    )
    frame = points_frame(the_plan, results)
    frame.attrs["path"] = str(path)
    return frame


def run(
    path: PathLike,
    sets: Sequence[str] = (),
    quick: bool = False,
    threads: Optional[int] = None,
    progress: Optional[ProgressCallback] = None,
) -> pd.DataFrame:
    """Run every point of an experiment and return one row per point.

    Args:
        path: the experiment file or a shipped experiment's name (see :func:`plan`).
        sets: ``KEY=VALUE`` overrides (see :func:`plan`).
        quick: the experiment's quick configuration.
        threads: worker threads inside Rust (default: the available CPUs). Results do not
            depend on it.
        progress: ``progress(done, total)`` called between chunks of about ``2 × threads``
            points.

    Returns:
        A frame with columns ``index, row, variant, label, rep, rng_seed, value, sim_ns, steps,
        wall_s``, ``c.<counter>`` for every counter, ``violations`` (list of str) and the
        provenance columns (:data:`shootdown.records.POINT_PROVENANCE_COLUMNS`).
        ``frame.attrs["plan"]`` holds the plan, so :func:`summarize` and :func:`to_records`
        need only the frame.
    """
    path = _experiment_file(path)
    the_plan = plan(path, sets, quick)
    return run_plan(path, the_plan, sets, quick, threads, progress)


def to_records(points: pd.DataFrame, the_plan: Optional[Plan] = None) -> pd.DataFrame:
    """Comparison records (see :mod:`shootdown.records`) of a frame returned by :func:`run`,
    with the plan's provenance (``sets``, ``quick``, ``modified``, …)."""
    the_plan = the_plan if the_plan is not None else points.attrs.get("plan")
    if the_plan is None:
        raise ValueError("to_records() needs the plan (pass it, or use a frame from shootdown.run)")
    return build_records(the_plan, summarize(points, the_plan))


def _matches(the_plan: Plan, file: Path, ident: str) -> bool:
    exp = the_plan["experiment"]
    return ident in (exp.get("seed"), exp.get("name"), file.stem)


def seed_experiments(
    ids: Optional[Sequence[str]] = None, quick: bool = False
) -> List[Tuple[Path, Plan]]:
    """The experiments under ``<data_root>/experiments/seeds/*.toml`` (sorted by file name),
    with their plans, optionally filtered.

    Args:
        ids: keep experiments whose ``seed`` (e.g. ``"000"``), ``name`` or file stem equals one
            of these. ``None`` or empty keeps all.
        quick: plan the quick configuration.

    Raises:
        ConfigError: an id matches no experiment, or an experiment file is invalid.
    """
    directory = paths.seeds_dir()
    files = sorted(directory.glob("*.toml"))
    planned = [(f, plan(f, (), quick)) for f in files]
    if not ids:
        return planned
    for ident in ids:
        if not any(_matches(p, f, ident) for f, p in planned):
            raise ConfigError(f"{directory}: {ident}: no seed experiment has this seed or name")
    return [(f, p) for f, p in planned if any(_matches(p, f, i) for i in ids)]


def reproduce(
    ids: Optional[Sequence[str]] = None,
    quick: bool = False,
    threads: Optional[int] = None,
    progress: Optional[ProgressCallback] = None,
) -> pd.DataFrame:
    """Run the seed experiments and compare them with the published numbers.

    Args:
        ids: seed ids (``"000"``) or experiment names to run; default all.
        quick: quick configuration (fewer rows and repetitions, shorter runs).
        threads: worker threads (default: available CPUs).
        progress: ``progress(done, total)`` over the points of all selected experiments.

    Returns:
        A records frame (columns :data:`shootdown.records.RECORD_COLUMNS`, provenance
        included), one row per (experiment, row, variant), experiments in file-name order.
        Directions follow the rule documented in :mod:`shootdown.records`.
    """
    selected = seed_experiments(ids, quick)
    total = sum(len(p["points"]) for _, p in selected)
    tracker = _Progress(total, progress)
    threads = _threads("reproduce", threads)
    frames = []
    for file, the_plan in selected:
        indices = [p["index"] for p in the_plan["points"]]
        results = _run_indices(str(file), [], bool(quick), indices, threads, tracker.advance)
        points = points_frame(the_plan, results)
        frames.append(build_records(the_plan, summarize(points, the_plan)))
    return concat_records(frames) if frames else empty_records()


def check(
    scenario: PathLike,
    mutant: Optional[str] = None,
    memory_model: str = "sc",
    max_states: Optional[int] = None,
    sample: Optional[int] = None,
    seed: int = 0,
    strategy: Optional[str] = None,
    progress: bool = False,
    symmetry: bool = True,
    sets: Optional[Sequence[str]] = None,
) -> CheckResult:
    """Model-check a scenario with the explorer.

    Args:
        scenario: a scenario file, or a name in ``<data_root>/scenarios/`` (``NAME`` or
            ``NAME.toml``).
        mutant: run a named mutant (a historical bug) instead of the fixed protocol.
        memory_model: ``"sc"`` or ``"tso"``.
        max_states: state bound of the search; None: a quarter of the memory available
            when each search starts, at ≈ 40 bytes a state depth-first and ≈ 173
            breadth-first (so the bound, and a verdict that reaches it, depends on the
            machine; give one for a verdict that does not). The result's ``max_states`` says
            which bound was used.
        sample: sample this many schedules instead of exploring all of them.
        seed: RNG seed of the sampling strategies.
        strategy: ``"auto"`` (``"dfs"``, then ``"parallel"`` for a shortest counterexample
            if it finds a violation), ``"dfs"`` (depth-first on every core with a
            fingerprint-only visited set: the least memory), ``"parallel"`` (breadth-first,
            shortest counterexamples, each level expanded on every core), ``"bfs"`` (the same
            on one thread), ``"random"`` or ``"pct"``; default ``"random"`` when ``sample``
            is given, else ``"auto"``. The exhaustive ones find the same on any core count.
        progress: show a live line (states, states/s, the deepest path or the frontier) on
            stderr while exploring; display only (the CLI turns it on when stderr is a
            terminal).
        symmetry: reduce by the scenario's declared ``symmetric`` CPU groups (exhaustive
            strategies; sound where the kernel's CPU-id order matters, see docs/checker.md).
        sets: ``KEY=VALUE`` overrides of the scenario's keys, applied in order before it is
            validated: ``options.smp_call=concurrent``, ``mms.0.map.0.npages=4`` (a number
            indexes an array), ``cpus=N`` (grows the scenario: the new CPUs run copies of the
            last role's tasks, and a note says which; docs/checker.md).

    Returns:
        ``{"scenario", "mutant", "bug", "memory_model", "verdict" ("violation" | "verified" |
        "bound-reached" | "interrupted": Ctrl-C stopped it and nothing is proved | "unreached":
        no explored step ran the mutant's code, so nothing is proved about it),
        "invariant", "states", "transitions", "seconds", "states_per_s", "peak_rss_mb" (the
        process's peak resident memory after the search, MB: on Linux and macOS; it includes
        whatever the process did before), "counterexample": [{"step", "actor", "text"},
        ...]}``.
    """
    resolved = paths.resolve_scenario(str(scenario))
    if resolved is None:
        raise ConfigError(f"{scenario}: scenario: no such scenario file or name")
    if strategy is None:
        strategy = "random" if sample is not None else "auto"
    module = native()
    if hasattr(module, "set_check_progress"):
        module.set_check_progress(bool(progress))
    result: CheckResult = call(
        "check",
        str(resolved),
        mutant,
        memory_model,
        None if max_states is None else _int_option(resolved, "max_states", max_states, 1),
        None if sample is None else _int_option(resolved, "sample", sample, 1),
        _int_option(resolved, "seed", seed, 0),
        strategy,
        bool(symmetry),
        list(sets or []),
    )
    seconds = float(result.get("seconds") or 0.0)
    result["states_per_s"] = result["states"] / seconds if seconds > 0 else None
    result["peak_rss_mb"] = _peak_rss_mb()
    return result


def _peak_rss_mb() -> Optional[float]:
    """This process's peak resident set size in MB (``None`` where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def check_list(scenarios_dir: Optional[PathLike] = None) -> List[ScenarioInfo]:
    """The scenarios and their mutants (default directory ``<data_root>/scenarios``)."""
    directory = Path(scenarios_dir) if scenarios_dir is not None else paths.scenarios_dir()
    return call("check_list", str(directory))


def _row_index(the_plan: Plan, path: PathLike, row: Any) -> int:
    rows = the_plan["rows"]
    if row is None:
        return 0
    for i, r in enumerate(rows):
        if row_key(r) == row_key(row) or str(r) == str(row):
            return i
    shown = ", ".join(str(r) for r in rows)
    raise ConfigError(f"{path}: row: no row {row} (rows: {shown})")


def _variant_name(the_plan: Plan, path: PathLike, variant: Optional[str]) -> str:
    variants = the_plan["variants"]
    if variant is None:
        return variants[0]["name"]
    for v in variants:
        if variant in (v["name"], v["label"]):
            return v["name"]
    shown = ", ".join(v["name"] for v in variants)
    raise ConfigError(f"{path}: variant: no variant {variant} (variants: {shown})")


def trace(
    path: PathLike,
    out: PathLike,
    row: Any = None,
    variant: Optional[str] = None,
    sets: Sequence[str] = (),
    quick: bool = False,
    duration_ms: float = TRACE_DURATION_MS,
    from_ms: Optional[float] = None,
) -> Path:
    """Write a Chrome/Perfetto trace (JSON) of a window of one run of an experiment.

    Args:
        path: the experiment file or a shipped experiment's name (see :func:`plan`).
        out: where to write the trace (open it in https://ui.perfetto.dev or chrome://tracing).
        row: the row *value* (e.g. ``8`` threads); default the first row.
        variant: variant name or label; default the baseline.
        sets, quick: as for :func:`run`.
        duration_ms: simulated time traced (default 2 ms: traces grow by about a megabyte per
            simulated millisecond of a busy 8-CPU run). The run stops at the window's end.
        from_ms: where the window starts, in simulated ms. ``None`` (default): just before the
            workload's first shootdown (its first IPI or ``kvm_flush_remote_tlbs``), a tenth of
            the window ahead of it; the run's first ``duration_ms`` if none ever happens.
            Slices running at the window's start are re-opened there and every slice still
            open at its end is closed, so the timeline is balanced.

    Returns:
        ``Path(out)``.
    """
    the_plan = plan(path, sets, quick)
    index = _row_index(the_plan, path, row)
    name = _variant_name(the_plan, path, variant)
    try:
        ms = float(duration_ms)
    except (TypeError, ValueError):
        ms = float("nan")
    if not 0 < ms <= 3_600_000:
        raise ConfigError(
            f"{path}: duration_ms: must be a number of ms in (0, 3600000] (got {duration_ms!r})"
        )
    start: Optional[float] = None
    if from_ms is not None:
        try:
            start = float(from_ms)
        except (TypeError, ValueError):
            start = float("nan")
        if not 0 <= start <= 3_600_000:
            raise ConfigError(
                f"{path}: from_ms: must be a number of ms in [0, 3600000] (got {from_ms!r})"
            )
    call(
        "trace",
        _experiment_file(path),
        _sets(sets),
        bool(quick),
        index,
        name,
        str(out),
        ms,
        start,
    )
    return Path(out)


def profile(
    path: PathLike,
    row: Any = None,
    variants: Optional[Sequence[str]] = None,
    sets: Sequence[str] = (),
    quick: bool = False,
    threads: Optional[int] = None,
) -> pd.DataFrame:
    """Profile one row of an experiment: where each variant's CPU time goes, per kernel function.

    Runs every repetition of the row for each variant (the same runs as :func:`run`, with the
    same results) and folds their trace events into per-function totals over the measured
    window; see :mod:`shootdown.profiling`.

    Args:
        path: the experiment file or a shipped experiment's name (see :func:`plan`).
        row: the row *value* (e.g. ``4`` threads); default the first row.
        variants: variant names or labels; default all, baseline first.
        sets, quick, threads: as for :func:`run`.

    Returns:
        A long frame, one row per (run, function): ``row, variant, label, rep, value, events,
        function, calls, exclusive_ns, inclusive_ns``. Pass it to
        :func:`shootdown.profiling.summarize_profile` for per-event figures and the change
        between variants.
    """
    the_plan = plan(path, sets, quick)
    index = _row_index(the_plan, path, row)
    wanted_row = the_plan["rows"][index]
    names = (
        [v["name"] for v in the_plan["variants"]]
        if variants is None
        else [_variant_name(the_plan, path, v) for v in variants]
    )
    indices = [
        p["index"]
        for p in the_plan["points"]
        if row_key(p["row"]) == row_key(wanted_row) and p["variant"] in names
    ]
    results = call(
        "profile_points",
        _experiment_file(path),
        _sets(sets),
        bool(quick),
        indices,
        _threads(path, threads),
    )
    frame = profiling.profile_frame(the_plan, results)
    frame.attrs["path"] = str(path)
    return frame


def bench(path: PathLike, sets: Sequence[str] = (), quick: bool = False) -> BenchResult:
    """Time one run of the experiment's first point (``path``, ``sets``, ``quick``: as for
    :func:`run`).

    Returns:
        ``{"steps", "wall_s", "sim_ns", "steps_per_s", "sim_s_per_wall_s"}``.
    """
    return call("bench", _experiment_file(path), _sets(sets), bool(quick))
