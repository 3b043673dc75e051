"""``shootdown calibrate``: measure this machine's primitives and two shootdown cases, and fit a
profile from them.

What is fitted from what (every fitted cost names its measurement in its ``source``, and lists
the cells it was fitted on in ``fitted``; ``shootdown validate`` marks those cells and predicts
every other one):

=========================  ==================================================================
cost                       from
=========================  ==================================================================
``syscall_entry_exit``     ``null_syscall``: the median time of ``getppid()``
``context_switch``         ``ctx_switch``: a switch, less a write and a read system call and the
                           base profile's ``wakeup`` (the pipe ping-pong's other work)
``sched_setaffinity``      ``migrate``: one migrating call, less its system call and a switch
the *page group* (× s_pg)  ``fault``: per page of an anonymous fault and its unmapping — the
                           exception, allocating, zeroing, the PTE written and cleared, the page
                           freed, the TLB refill
the *call group* (× s_c)   ``madvise-1/T0``: per call — the VMA and range walk, mmap's VMA work,
                           freeing page tables, INVLPG and the CR3/INVPCID flushes
the *IPI group* (× s_ipi)  ``madvise-1/T1-busy``: sending, delivering and taking an IPI (and, in
                           a guest, the VM exits on it)
``vcpu_wakeup`` (guest) /  ``wake_ipi``: half a round trip less what the model charges for the
``idle_wakeup`` (native)   rest of a wake-up of an idle CPU (two system calls, ``wakeup``,
                           ``context_switch``, the IPI path)
``user_touch_page``        not measured: the cases' touch is a one-byte store, so the base
                           profile's ``l1_hit`` (the seeds' profiles price a whole-page copy)
=========================  ==================================================================

A group keeps the base profile's ratios among its costs and is scaled as a whole. The three
group scales are found together by running the model (the twins of the three cases,
:mod:`shootdown.twin`): a case's time is linear in its costs, so one run at the base and one per
group with its scale doubled give the linear system the measured times solve; a last run checks
the solution.

Every other cost is the base profile's (``kvm-tdp-host-2023`` for a guest, ``haswell-x-2s48t``
on bare metal), named by ``inherits``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import hostcases, paths, twin
from ._bridge import ConfigError
from .hostcases import Case

__all__ = [
    "MM_GROUP",
    "IPI_GROUP",
    "Calibration",
    "base_profile_name",
    "calibrate",
    "fit_profile",
    "write_profile",
]

#: Per page of an anonymous fault and of its unmapping, scaled together by the ``fault``
#: primitive: the exception, allocating and zeroing the page, writing and clearing its PTE,
#: freeing it, and the TLB refill after.
PAGE_GROUP: Tuple[str, ...] = (
    "page_fault_entry_exit",
    "page_alloc",
    "page_zero",
    "page_free",
    "pte_update",
    "tlb_miss_walk",
)
#: Per call of the mm system calls and their flushes, scaled together by ``madvise-1/T0``: the
#: VMA and range-walk work, mmap's VMA work, freeing page tables, INVLPG and the CR3/INVPCID
#: flushes.
CALL_GROUP: Tuple[str, ...] = (
    "unmap_base",
    "mmap_syscall",
    "pgtable_free",
    "invlpg",
    "invpcid_single",
    "cr3_write_flush",
    "cr3_write_noflush",
)
#: Both: the kernel mm work of the shootdown cases.
MM_GROUP: Tuple[str, ...] = PAGE_GROUP + CALL_GROUP
#: Sending, delivering and taking an IPI, scaled together by the IPI fit (in a guest also the
#: VM exit + entry that PV send-IPI, injection and EOI cost).
IPI_GROUP: Tuple[str, ...] = (
    "ipi_send",
    "ipi_send_per_target",
    "ipi_latency_same_socket",
    "ipi_latency_cross_socket",
    "irq_entry",
    "irq_exit",
    "irq_user_entry",
    "irq_user_exit",
)
GUEST_IPI_GROUP: Tuple[str, ...] = IPI_GROUP + ("vm_exit_entry",)

#: A fitted scale or cost below this is clamped (and the clamp reported).
_MIN_SCALE = 0.05

DEFAULT_PROFILE = Path("shootdown-host.toml")
PROFILE_NAME = "shootdown-host"


def base_profile_name(guest: bool) -> str:
    """The shipped profile every unmeasured cost comes from."""
    return "kvm-tdp-host-2023" if guest else "haswell-x-2s48t"


def _resolved_costs(name: str) -> Dict[str, float]:
    """A shipped profile's cost values, following ``inherits``."""
    chain: List[Dict[str, Any]] = []
    seen = set()
    while name:
        if name in seen:
            raise ConfigError(f"{name}: profile.inherits: inheritance cycle")
        seen.add(name)
        data = twin.load_profile_file(paths.profiles_dir() / f"{name}.toml")
        chain.append(data)
        name = data.get("profile", {}).get("inherits", "")
    costs: Dict[str, float] = {}
    for data in reversed(chain):
        for k, v in data.get("cost", {}).items():
            costs[k] = float(v["value"] if isinstance(v, dict) else v)
    return costs


@dataclass
class FittedCost:
    value: float
    source: str
    fitted: List[str] = field(default_factory=list)


@dataclass
class Calibration:
    """What ``calibrate`` measured and fitted."""

    host: Dict[str, Any]
    measured: Dict[str, Dict[str, Any]]
    base: str
    costs: Dict[str, FittedCost] = field(default_factory=dict)
    scales: Dict[str, float] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)

    @property
    def guest(self) -> bool:
        return bool(self.host.get("hypervisor"))


def _us(result: Dict[str, Any]) -> float:
    return float(result["median_us"])


def _machine_table(host: Dict[str, Any]) -> Dict[str, Any]:
    kvm = host.get("kvm_features") or {}
    m: Dict[str, Any] = {
        "cpu_model": str(host.get("cpu_model", "")),
        "kernel": str(host.get("kernel_release", "")),
        "measured_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sockets": int(host.get("sockets") or 1),
        "cores_per_socket": int(host.get("cores_per_socket") or 1),
        "threads_per_core": int(host.get("threads_per_core") or 1),
        "online_cpus": int(host.get("online_cpu_count") or len(host.get("online_cpus") or [1])),
        "idle_poll": bool(host.get("idle_poll")),
    }
    if host.get("hypervisor"):
        m["hypervisor"] = str(host["hypervisor"])
        for k in ("pv_tlb_flush", "pv_send_ipi", "pv_sched_yield", "pv_unhalt"):
            m[k] = bool(kvm.get(k))
    return m


def _pti(host: Dict[str, Any]) -> bool:
    text = str((host.get("mitigations") or {}).get("meltdown", ""))
    return "PTI" in text


def write_profile(cal: Calibration, path: Path, name: str = PROFILE_NAME) -> None:
    """Write the profile TOML atomically (a temporary file renamed over ``path``)."""
    host = cal.host
    machine = _machine_table(host)
    lines = [
        f"# Calibrated by `shootdown calibrate` on {machine['measured_at']}:",
        f"# {machine['cpu_model']}, Linux {machine['kernel']}, {machine['online_cpus']} online CPUs"
        + (f", a {machine['hypervisor']} guest." if cal.guest else ", bare metal."),
        "# Fitted costs name the measurement they came from; every other cost is the base",
        f"# profile's ({cal.base}). `shootdown validate --profile {path.name}` compares.",
        "",
        "[profile]",
        f"name = {json.dumps(name)}",
        f"description = {json.dumps('this machine, calibrated: ' + machine['cpu_model'])}",
        f"inherits = {json.dumps(cal.base)}",
        "",
        "[machine]",
    ]
    lines += [f"{k} = {twin._toml_value(v)}" for k, v in machine.items()]
    lines += [
        "",
        "[features]",
        f"pcid = {twin._toml_value(bool(host.get('pcid')))}",
        f"invpcid = {twin._toml_value(bool(host.get('invpcid')))}",
        f"pti = {twin._toml_value(_pti(host))}",
        "",
        "[cost]",
    ]
    for key, c in cal.costs.items():
        entry = {"value": round(c.value, 3), "source": c.source}
        if c.fitted:
            entry["fitted"] = list(c.fitted)
        lines.append(f"{key} = {twin._toml_value(entry)}")
    text = "\n".join(lines) + "\n"
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.resolve().parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Group:
    """Costs scaled together (from their base values) so that the twin of ``case`` takes the
    measured time."""

    label: str
    keys: Tuple[str, ...]
    case: Case


def _fit_groups(
    cal: Calibration,
    groups: Sequence[Group],
    base: Dict[str, float],
    scratch: Path,
) -> None:
    """Fit one scale per group at once, so that every group's case takes its measured time.

    A case's simulated time is linear in the costs (each step charges a sum of them), so with
    ``y(s)`` the twins' times at scales ``s``: one run at ``s = 1`` and one per group with its
    scale doubled give the matrix ``J`` of ``∂y/∂s``, and ``J (s - 1) = measured - y(1)`` is
    solved. A run at the solution checks it. Records the fitted costs in ``cal``.
    """
    cases = [g.case for g in groups]
    targets = [_us(cal.measured[c.name]) for c in cases]

    def sim(scales: Sequence[float]) -> List[float]:
        trial = Calibration(cal.host, cal.measured, cal.base, dict(cal.costs))
        for g, sc in zip(groups, scales):
            for k in g.keys:
                trial.costs[k] = FittedCost(base[k] * sc, "trial")
        path = scratch / f"{PROFILE_NAME}.toml"
        write_profile(trial, path)
        got = twin.simulate(path, cases, threads=1)
        return [float(got[c.name]["mean_us"]) for c in cases]

    n = len(groups)
    y1 = sim([1.0] * n)
    jac = []
    for j in range(n):
        yj = sim([2.0 if i == j else 1.0 for i in range(n)])
        jac.append([yj[i] - y1[i] for i in range(n)])  # column j
    matrix = [[jac[j][i] for j in range(n)] for i in range(n)]
    rhs = [targets[i] - y1[i] for i in range(n)]
    delta = _solve(matrix, rhs)
    if delta is None:
        raise ConfigError(
            "calibrate: the simulated cases "
            + ", ".join(c.name for c in cases)
            + " do not depend on the groups "
            + ", ".join(g.label for g in groups)
            + " independently; cannot fit them"
        )
    scales = [1.0 + d for d in delta]
    for g, sc in zip(groups, scales):
        if sc < _MIN_SCALE:
            cal.warnings.append(
                f"{g.label}: the fit asked for × {sc:.3f} of the base costs (the model charges "
                f"more than {g.case.name} measured without them); clamped to × {_MIN_SCALE}"
            )
    scales = [max(sc, _MIN_SCALE) for sc in scales]
    for g, sc, target in zip(groups, scales, targets):
        for k in g.keys:
            cal.costs[k] = FittedCost(
                base[k] * sc,
                f"fitted: {cal.base}'s value × {sc:.3f}, the {g.label} scale that makes the "
                f"model's {g.case.name} equal the measured median {target:.3f} us",
                [g.case.cell],
            )
        cal.scales[g.label] = sc
    check = sim(scales)
    for c, got, want in zip(cases, check, targets):
        if abs(got - want) > 0.02 * want:
            cal.warnings.append(
                f"{c.name}: the fitted profile simulates {got:.3f} µs against {want:.3f} "
                "measured (a clamped scale, or a case not linear in its costs)"
            )


def _solve(a: List[List[float]], b: List[float]) -> Optional[List[float]]:
    """Gaussian elimination with partial pivoting; ``None`` if ``a`` is singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    scale = max((abs(x) for row in a for x in row), default=0.0)
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) <= 1e-9 * max(scale, 1e-300):
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def _direct(cal: Calibration, key: str, value_ns: float, source: str, cell: str) -> None:
    if value_ns < 0:
        cal.warnings.append(f"{key}: the fit gave {value_ns:.1f} ns; clamped to 0")
        value_ns = 0.0
    cal.costs[key] = FittedCost(value_ns, source, [cell])


def fit_profile(host: Dict[str, Any], measured: Dict[str, Dict[str, Any]]) -> Calibration:
    """Fit the costs from the measurements (``measured``: case name → ``CaseResult``)."""
    guest = bool(host.get("hypervisor"))
    cal = Calibration(host, measured, base_profile_name(guest))
    base = _resolved_costs(cal.base)

    def ns(op: str) -> float:
        return _us(measured[op]) * 1000.0

    sc = ns("null_syscall")
    _direct(
        cal,
        "syscall_entry_exit",
        sc,
        f"measured: null_syscall (getppid) median {sc:.1f} ns",
        Case("null_syscall").cell,
    )
    cs = ns("ctx_switch") - 2 * sc - base["wakeup"]
    _direct(
        cal,
        "context_switch",
        cs,
        f"fitted: ctx_switch median {ns('ctx_switch'):.1f} ns per switch, less 2 system calls "
        f"and the base wakeup ({base['wakeup']:.0f} ns)",
        Case("ctx_switch").cell,
    )
    cs = cal.costs["context_switch"].value
    if "migrate" in measured:
        _direct(
            cal,
            "sched_setaffinity",
            ns("migrate") - sc - cs,
            f"fitted: migrate median {ns('migrate'):.1f} ns per call, less a system call and a "
            "context switch",
            Case("migrate").cell,
        )

    # What the cases' "touch" is: one byte written per page, a store that hits the cache. The
    # base profiles price the seeds' touches (a page copied, a record written).
    cal.costs["user_touch_page"] = FittedCost(
        base["l1_hit"],
        f"assumed: the validation cases write one byte per page (an L1-hit store: {cal.base}'s "
        "l1_hit)",
    )
    groups = [
        Group("page", PAGE_GROUP, Case("fault", hostcases.FAULT_PAGES)),
        Group("call", CALL_GROUP, Case("madvise", 1, 0)),
    ]
    busy = Case("madvise", 1, 1, "busy")
    if busy.name in measured:
        groups.append(Group("IPI", GUEST_IPI_GROUP if guest else IPI_GROUP, busy))
    else:
        cal.warnings.append("one online CPU: the IPI costs stay the base profile's")
    with tempfile.TemporaryDirectory(prefix="shootdown-calibrate-") as tmp:
        _fit_groups(cal, groups, base, Path(tmp))

    def cost(k: str) -> float:
        return cal.costs[k].value if k in cal.costs else base[k]

    # Half a wake-up round trip: the waker's write() and wake-up, the IPI to the idle CPU and
    # the wakee's switch-in and read() return; what is left is the idle CPU's own wake-up.
    if "wake_ipi" in measured:
        rest = (
            2 * cost("syscall_entry_exit")
            + cost("wakeup")
            + cost("context_switch")
            + cost("ipi_send")
            + cost("ipi_latency_same_socket")
            + cost("irq_entry")
            + cost("irq_exit")
        )
        _direct(
            cal,
            "vcpu_wakeup" if guest else "idle_wakeup",
            ns("wake_ipi") / 2 - rest,
            f"fitted: wake_ipi median {ns('wake_ipi'):.1f} ns per round trip, half of it less "
            f"the model's other wake-up costs ({rest:.0f} ns)",
            Case("wake_ipi").cell,
        )
    return cal


ProgressFn = Callable[[str, int, int], None]


#: Each case is measured in this many rounds, round-robin over the cases, and the round whose
#: median is the median of the rounds' is kept: a host's slow phases last seconds, and a case
#: measured once can land in one. A round is *disturbed* when its repetitions spread more than
#: :data:`MAX_SPREAD` (max / min) or a busy sibling got less than :data:`MIN_SIBLING_SHARE` of
#: its CPU (another task ran there: fewer flushes found the mm loaded).
ROUNDS = 3
MAX_SPREAD = 1.3
MIN_SIBLING_SHARE = 0.9


def disturbance(case: Case, result: Dict[str, Any]) -> Optional[str]:
    """Why a measurement looks disturbed by other work on the machine, or ``None``."""
    share = result.get("sibling_cpu_share")
    if case.mode == "busy" and case.siblings and share is not None and share < MIN_SIBLING_SHARE:
        return f"busy siblings had {share:.0%} of their CPUs"
    lo, hi = float(result["min_us"]), float(result["max_us"])
    if lo > 0 and hi / lo > MAX_SPREAD:
        return f"repetitions spread {lo:.2f}–{hi:.2f} µs"
    return None


def measure_cases(
    cases: Sequence[Case],
    reps: int,
    target_ms: float,
    progress: Optional[ProgressFn] = None,
    warnings: Optional[List[str]] = None,
    rounds: int = ROUNDS,
) -> Dict[str, Dict[str, Any]]:
    """Measure every case in ``rounds`` rounds (round-robin) and keep, per case, the round with
    the median median; ``progress(name, done, total)`` before each measurement. The result has
    the round medians as ``round_medians`` and ``disturbed`` (why the kept round looks
    disturbed, or ""); a disturbed kept round adds a line to ``warnings``."""
    trials: Dict[str, List[Dict[str, Any]]] = {c.name: [] for c in cases}
    total = rounds * len(cases)
    for r in range(rounds):
        for i, case in enumerate(cases):
            if progress is not None:
                progress(case.name, r * len(cases) + i, total)
            trials[case.name].append(hostcases.measure(case, reps, target_ms))
    out: Dict[str, Dict[str, Any]] = {}
    for case in cases:
        runs = sorted(trials[case.name], key=lambda t: float(t["median_us"]))
        kept = dict(runs[(len(runs) - 1) // 2])
        kept["round_medians"] = [float(t["median_us"]) for t in trials[case.name]]
        why = disturbance(case, kept) or ""
        kept["disturbed"] = why
        if why and warnings is not None:
            warnings.append(f"{case.name}: the median round looks disturbed ({why})")
        out[case.name] = kept
    if progress is not None:
        progress("", total, total)
    return out


def calibrate(
    out: Path = DEFAULT_PROFILE,
    reps: int = 5,
    target_ms: float = 30.0,
    progress: Optional[ProgressFn] = None,
) -> Calibration:
    """Measure, fit, and write the profile to ``out``; returns the calibration."""
    host = hostcases.probe()
    cpus = hostcases.online_cpus(host)
    noise: List[str] = []
    measured = measure_cases(hostcases.calibration_cases(cpus), reps, target_ms, progress, noise)
    cal = fit_profile(host, measured)
    cal.warnings[:0] = noise
    write_profile(cal, Path(out))
    return cal
