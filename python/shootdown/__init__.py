"""shootdown — a simulator of x86 Linux TLB shootdowns (Python front end).

Quick tour (shipped experiments and scenarios by name, from any directory)::

    import shootdown
    points = shootdown.run("seed002-madv-dontneed", quick=True)  # one row per simulated run
    summary = shootdown.summarize(points)         # avg (stdev) per row × variant, change %
    records = shootdown.reproduce(["002"], quick=True)
    print(shootdown.report.format_table(records))  # beside the published numbers
    result = shootdown.check("lazy_munmap", mutant="lazy_ignores_freed_tables")
    print(result["verdict"], result["invariant"])  # violation INV-PTFREE (bug N3)

The simulator and checker are Rust (``shootdown._native``); this package plans, runs in
parallel, summarizes, compares with published numbers, caches sweeps and prints reports.
"""

from __future__ import annotations

from . import paths, plot, profiling, records, report, schema
from ._bridge import ConfigError, NativeUnavailableError
from ._version import __version__
from .api import (
    bench,
    check,
    check_list,
    default_threads,
    plan,
    profile,
    reproduce,
    run,
    seed_experiments,
    to_records,
    trace,
)
from .paths import data_root
from .records import summarize
from .sweep import summarize_sweep, sweep

__all__ = [
    "__version__",
    "ConfigError",
    "NativeUnavailableError",
    "bench",
    "check",
    "check_list",
    "data_root",
    "default_threads",
    "paths",
    "plan",
    "plot",
    "profile",
    "profiling",
    "records",
    "report",
    "reproduce",
    "run",
    "schema",
    "seed_experiments",
    "summarize",
    "summarize_sweep",
    "sweep",
    "to_records",
    "trace",
]
