"""Typed shapes of the JSON that ``shootdown._native`` returns (the native contract).

These are ``TypedDict``\\ s: at run time they are plain ``dict``\\ s.
"""

from __future__ import annotations

from typing import Dict, List, Optional, TypedDict, Union

__all__ = [
    "RowValue",
    "ExperimentInfo",
    "VariantInfo",
    "PublishedCell",
    "PlannedPoint",
    "InputFile",
    "Plan",
    "PointResult",
    "CheckStep",
    "BugInfo",
    "CheckResult",
    "MutantInfo",
    "ScenarioInfo",
    "BenchResult",
]

#: A row of an experiment: the value of its ``row_key`` (e.g. a thread count, a VM count).
RowValue = Union[int, float, str]


class ExperimentInfo(TypedDict):
    name: str
    seed: Optional[str]
    title: str
    profile: str  # "<name> + override(KEYS)" when a [profile_override] applies
    metric: str
    unit: str
    row_key: str
    higher_is_better: bool
    repetitions: int
    path: str  # the experiment file read


class VariantInfo(TypedDict):
    name: str
    label: str


class PublishedCell(TypedDict):
    row: RowValue
    variant: str
    value: float
    stdev: Optional[float]


class PlannedPoint(TypedDict):
    index: int
    row: RowValue
    variant: str
    rep: int
    seed: int


class InputFile(TypedDict):
    """A file a run reads, with the SHA-256 of the bytes read."""

    path: str
    sha256: str


class Plan(TypedDict):
    """What ``plan()`` returns. ``variants[0]`` is the baseline. ``inputs`` lists every file
    the runs read: the experiment file, then each profile file of the ``inherits`` chain.
    ``sets`` are the ``--set KEY=VALUE`` overrides applied, in order. ``quick`` is not in the
    native answer: :func:`shootdown.plan` adds it."""

    experiment: ExperimentInfo
    variants: List[VariantInfo]
    rows: List[RowValue]
    published: List[PublishedCell]
    points: List[PlannedPoint]
    inputs: List[InputFile]
    sets: List[str]
    quick: bool


class PointResult(TypedDict):
    index: int
    row: RowValue
    variant: str
    rep: int
    value: float
    sim_ns: float
    steps: int
    wall_s: float
    counters: Dict[str, float]
    violations: List[str]


class CheckStep(TypedDict):
    step: int
    actor: str
    text: str


class BugInfo(TypedDict):
    id: str  # the catalog id (docs/bugs/CATALOG.md): "K1", "N3", "A2", ...
    title: str
    fix: Optional[str]  # the fixing commit
    cves: List[str]


class CheckResult(TypedDict):
    scenario: str
    mutant: Optional[str]
    bug: Optional[BugInfo]  # the catalogued bug the mutant re-creates, if any
    memory_model: str
    # "violation" | "verified" | "bound-reached" | "interrupted" | "unreached" (the mutant's code
    # never ran: nothing is proved about it)
    verdict: str
    invariant: Optional[str]
    states: int
    transitions: int
    seconds: float
    max_states: int  # the state bound used (--max-states, or the memory-based default)
    states_per_s: Optional[float]  # states / seconds (None for a zero-time search)
    peak_rss_mb: Optional[float]  # the process's peak resident memory after the search
    counterexample: List[CheckStep]
    setup: List[CheckStep]  # the scenario's setup steps (run with the mutant on), before step 1
    notes: List[str]  # what the verdict does not say by itself (TSO mutant under SC, bound)


class MutantInfo(TypedDict):
    name: str
    bug: Optional[str]  # catalog id
    fix: Optional[str]  # the catalogued bug's fixing commit
    cves: List[str]
    description: str
    expect: Optional[str]
    memory_model: str


class ScenarioInfo(TypedDict):
    scenario: str
    description: str
    mutants: List[MutantInfo]


class BenchResult(TypedDict):
    steps: int
    wall_s: float
    sim_ns: float
    steps_per_s: float
    sim_s_per_wall_s: float
