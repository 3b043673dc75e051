"""The cases ``shootdown calibrate`` and ``shootdown validate`` measure on the real machine, and
what each one is for. Declared once here; the measuring code is the Rust crate
``shootdown-hostbench`` (through ``shootdown._native.host_run_case``), the simulated twin of a
shootdown case is the ``host_micro`` workload.

Thread 0 is pinned to the first online CPU and loops the operation; ``siblings`` threads of the
same process sit on the next CPUs, each on a page of its own: *busy* (reading it in a loop, so
their CPUs have the mm loaded and get every flush IPI) or *sleeping* (in ``pause()``: their CPUs
idle with the mm lazily loaded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from ._bridge import HostError, native

__all__ = [
    "Case",
    "PRIMITIVES",
    "SHOOTDOWN_OPS",
    "shootdown_cases",
    "calibration_cases",
    "probe",
    "measure",
]


#: The variant every twin experiment runs (its name appears in fitted-cell ids).
TWIN_VARIANT = "calibrated"


def twin_experiment_name(family: str, mode: str) -> str:
    """The name of the twin experiment of a case family and sibling mode."""
    return f"validate-{family}-{mode}"


@dataclass(frozen=True)
class Case:
    """One measurement: an operation, its size, and the siblings beside it."""

    op: str
    pages: int = 1
    siblings: int = 0
    mode: str = "busy"

    @property
    def family(self) -> str:
        """The operation and its size: ``madvise-1``, ``munmap-2M``, ``null_syscall``."""
        if self.op in SHOOTDOWN_OPS:
            return "munmap-2M" if self.op == "munmap" else f"{self.op}-{self.pages}"
        return self.op

    @property
    def name(self) -> str:
        """``madvise-1/T1-busy``; a primitive is its op."""
        if self.op not in SHOOTDOWN_OPS:
            return self.op
        if self.siblings == 0:
            return f"{self.family}/T0"
        return f"{self.family}/T{self.siblings}-{self.mode}"

    @property
    def twin_mode(self) -> str:
        """The sibling mode of the twin experiment this case is a row of: T = 0 runs with the
        busy ones (it has no siblings)."""
        return "busy" if self.siblings == 0 else self.mode

    @property
    def cell(self) -> str:
        """The id of this case's cell, as a profile's ``fitted`` lists name it: the twin's
        ``EXPERIMENT/VARIANT/ROW`` for a shootdown case, ``host/OP`` for a primitive."""
        if self.op not in SHOOTDOWN_OPS:
            return f"host/{self.op}"
        experiment = twin_experiment_name(self.family, self.twin_mode)
        return f"{experiment}/{TWIN_VARIANT}/{self.siblings}"

    def spec(self, reps: int, target_ms: float) -> Dict[str, Any]:
        """The JSON case spec of ``shootdown-hostbench``."""
        return {
            "op": self.op,
            "pages": self.pages,
            "siblings": self.siblings,
            "sibling_mode": self.mode,
            "reps": reps,
            "target_ms": target_ms,
        }


#: The shootdown operations and the page counts they run with (``host_micro``'s ``op`` and
#: ``pages``): madvise of 1 page and of 32 (still at or under ``tlb_single_page_flush_ceiling``
#: = 33, so flushed page by page), an mprotect downgrade/upgrade pair over 8 pages, and an
#: mmap/touch/munmap of an isolated 2 MiB region (frees its page table: ``freed_tables``).
SHOOTDOWN_OPS: Dict[str, Sequence[int]] = {
    "madvise": (1, 32),
    "mprotect": (8,),
    "munmap": (512,),
}

#: The ``fault`` primitive's pages per region: all 512 of the 2 MiB region, so that the region's
#: mmap, page table and munmap are 1/512 of a page's time and the primitive measures the work
#: per page.
FAULT_PAGES = 512

#: Ops of a case per iteration of its simulated twin (``host_micro``'s metric is µs per
#: iteration): the ``fault`` primitive's op is one page.
TWIN_OPS_PER_ITERATION: Dict[str, int] = {"fault": FAULT_PAGES}

#: The primitives, each with what its time is (the unit of ``us_per_op``).
PRIMITIVES: Dict[str, str] = {
    "null_syscall": "µs per getppid()",
    "fault": f"µs per page: a first write to a fresh anonymous page and its share of the "
    f"munmap that frees it ({FAULT_PAGES} pages of a 2 MiB region)",
    "ctx_switch": "µs per context switch (two threads on one CPU, pipe ping-pong)",
    "wake_ipi": "µs per round trip (two threads on two CPUs, pipe ping-pong: two wake-ups)",
    "migrate": "µs per sched_setaffinity() that moves the caller to the other CPU",
}


def shootdown_cases(cpus: int) -> List[Case]:
    """Every shootdown case for a machine of ``cpus`` online CPUs: T = 0, then T = 1 … cpus-1
    with busy and with sleeping siblings."""
    cases: List[Case] = []
    for op, sizes in SHOOTDOWN_OPS.items():
        for pages in sizes:
            cases.append(Case(op, pages, 0))
            for t in range(1, cpus):
                for mode in ("busy", "sleeping"):
                    cases.append(Case(op, pages, t, mode))
    return cases


def calibration_cases(cpus: int) -> List[Case]:
    """What ``calibrate`` measures: the primitives (those needing two CPUs only where there
    are two), and madvise of one page with no sibling and (with two CPUs or more) with one busy
    sibling."""
    two_cpu = {"wake_ipi", "migrate"}
    cases = [
        Case(op, FAULT_PAGES if op == "fault" else 1)
        for op in PRIMITIVES
        if cpus >= 2 or op not in two_cpu
    ]
    cases.append(Case("madvise", 1, 0))
    if cpus >= 2:
        cases.append(Case("madvise", 1, 1, "busy"))
    return cases


def probe() -> Dict[str, Any]:
    """The host's description (``shootdown-hostbench``'s ``HostInfo``): CPU model, topology,
    kernel, mitigations, PCID, hypervisor and its PV features."""
    return json.loads(native().host_probe())


def cpu_count(host: Dict[str, Any]) -> int:
    """The CPUs this process may run on, as :func:`probe` found them."""
    return int(host.get("online_cpu_count") or len(host.get("online_cpus") or []))


def online_cpus(host: Dict[str, Any]) -> int:
    """:func:`cpu_count`, at least two, or a one-line ``HostError``: every shootdown needs a
    sibling on another CPU, and the IPI costs a second CPU to measure."""
    cpus = cpu_count(host)
    if cpus < 2:
        raise HostError(
            f"only {cpus} online CPU in this process's affinity mask: calibrate and validate "
            "need at least 2 (a sibling thread on another CPU); run outside taskset or a "
            "one-CPU cpuset"
        )
    return cpus


def measure(case: Case, reps: int = 5, target_ms: float = 30.0) -> Dict[str, Any]:
    """Run one case on this machine (``CaseResult``: ``us_per_op`` per repetition, ``median_us``,
    ``min_us``, ``max_us``, ``tlb_ipis_per_op``…)."""
    return json.loads(native().host_run_case(json.dumps(case.spec(reps, target_ms))))
