"""The simulated twin of this machine: the cases of :mod:`shootdown.hostcases` run through the
model (the ``host_micro`` workload) on a calibrated profile, with the machine its ``[machine]``
table describes.

The twin is an experiment file like any other, written into a scratch directory beside a copy of
the profile (so the profile's ``inherits`` still finds the shipped profiles). A guest machine
(``hypervisor`` set) runs on the host layer: one VM with a vCPU per online CPU, vCPU *i* alone on
pCPU *i* (no overcommit, no host noise: assumed, since a guest cannot see its host's load), with
the PV features the guest reported; a bare-metal machine runs natively. The kernel is mainline's
form (``lazy_tlb = mainline``, concurrent flushes, PCID when the profile has it).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import api
from ._bridge import ConfigError
from .hostcases import TWIN_OPS_PER_ITERATION, TWIN_VARIANT, Case
from .hostcases import twin_experiment_name as experiment_name

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["load_profile_file", "machine_of", "twin_options", "experiment_text", "simulate"]

#: Iterations of thread 0's loop per simulated run (after its warm-up), by default and for the
#: ops whose iteration is long (the ``fault`` primitive's 512 pages).
ITERATIONS = 400
WARMUP = 20
LONG_ITERATIONS = {"fault": (20, 2)}


def iterations(op: str) -> Tuple[int, int]:
    """(measured, warm-up) iterations of a twin run of ``op``."""
    return LONG_ITERATIONS.get(op, (ITERATIONS, WARMUP))


#: Simulated repetitions per case (their RNG streams differ: host noise, ASID rotors).
REPETITIONS = 3


def load_profile_file(path: Path) -> Dict[str, Any]:
    """A profile file's TOML; a missing or malformed file is a one-line ``ConfigError``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: -: cannot read: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: -: malformed TOML: {exc}") from None


def machine_of(profile: Mapping[str, Any], path: Path) -> Dict[str, Any]:
    """The profile's ``[machine]`` table, with the keys the twin needs checked."""
    m = profile.get("machine")
    if not isinstance(m, dict):
        raise ConfigError(
            f"{path}: machine: missing: not a calibrated profile "
            "(run `shootdown calibrate --out FILE` to make one)"
        )
    for key in ("sockets", "cores_per_socket", "threads_per_core", "online_cpus"):
        if not isinstance(m.get(key), int) or m[key] < 1:
            raise ConfigError(f"{path}: machine.{key}: missing or not a positive integer")
    return dict(m)


def profile_name(profile: Mapping[str, Any], path: Path) -> str:
    name = profile.get("profile", {}).get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}: profile.name: missing")
    return name


def twin_options(machine: Mapping[str, Any], pcid: bool) -> Dict[str, Any]:
    """The kernel options of the twin: mainline, with the guest's PV features."""
    opts: Dict[str, Any] = {
        "lazy_tlb": "mainline",
        "smp_call": "concurrent",
        "pcid": bool(pcid),
        "idle": "poll" if machine.get("idle_poll") else "halt",
    }
    if machine.get("hypervisor"):
        opts.update(
            pv_tlb_flush=bool(machine.get("pv_tlb_flush")),
            pv_send_ipi=bool(machine.get("pv_send_ipi")),
            # Whether the host posts interrupts (APICv / AVIC) is invisible to a guest:
            # assumed not, so an IPI to a running vCPU costs it an injection exit and an EOI.
            posted_interrupts=False,
            # Mainline KVM marks a vCPU preempted only when it was preempted while runnable.
            set_preempted="involuntary",
        )
    return opts


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {v!r}")


def experiment_text(
    profile: str,
    machine: Mapping[str, Any],
    pcid: bool,
    op: str,
    pages: int,
    mode: str,
    rows: Sequence[int],
    family: str,
) -> str:
    """The twin experiment of one case family and sibling mode, a row per sibling count."""
    cpus = int(machine["online_cpus"])
    lines = [
        "[experiment]",
        f"name = {_toml_value(experiment_name(family, mode))}",
        f"title = {_toml_value(f'{family} + touch, {mode} siblings (this machine)')}",
        f"profile = {_toml_value(profile)}",
        'metric = "time per iteration"',
        'unit = "us"',
        f"repetitions = {REPETITIONS}",
        f"quick_repetitions = {REPETITIONS}",
        'row_key = "siblings"',
        f"rows = {_toml_value(list(rows))}",
        "higher_is_better = false",
        "",
        "[topology]",
        f"sockets = {int(machine['sockets'])}",
        f"cores_per_socket = {int(machine['cores_per_socket'])}",
        f"threads_per_core = {int(machine['threads_per_core'])}",
        "",
    ]
    if machine.get("hypervisor"):
        lines += ["[host]", "vms = 1", f"vcpus_per_vm = {cpus}", ""]
    lines += [
        "[workload]",
        'kind = "host_micro"',
        f"op = {_toml_value(op)}",
        f"sibling_mode = {_toml_value(mode)}",
        f"iterations = {iterations(op)[0]}",
        f"warmup_iterations = {iterations(op)[1]}",
    ]
    if op != "munmap":
        lines.append(f"pages = {pages}")
    lines += [
        "",
        f"[variants.{TWIN_VARIANT}]",
        'label = "this machine"',
        f"options = {_toml_value(twin_options(machine, pcid))}",
        "",
    ]
    return "\n".join(lines)


def _groups(cases: Iterable[Case]) -> Dict[Tuple[str, int, str], List[Case]]:
    """Cases by (op, pages, mode); T = 0 runs with the busy group (it has no siblings)."""
    out: Dict[Tuple[str, int, str], List[Case]] = {}
    for c in cases:
        out.setdefault((c.op, c.pages, c.twin_mode), []).append(c)
    return out


def simulate(
    profile_path: Path,
    cases: Sequence[Case],
    sets: Sequence[str] = (),
    threads: Optional[int] = None,
) -> Dict[str, Dict[str, Any]]:
    """Run the twin of every case on the profile; ``sets`` are ``--set`` overrides applied to
    every twin experiment (``profile_override.cost.KEY=VALUE`` while fitting).

    Returns ``{case.name: {"median_us", "mean_us", "stdev_us", "tlb_ipis_per_op",
    "violations"}}``; every number comes from running the model.
    """
    profile_path = Path(profile_path)
    profile = load_profile_file(profile_path)
    name = profile_name(profile, profile_path)
    machine = machine_of(profile, profile_path)
    pcid = bool(profile.get("features", {}).get("pcid", True))
    out: Dict[str, Dict[str, Any]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="shootdown-twin-"))
    try:
        (scratch / "profiles").mkdir()
        shutil.copyfile(profile_path, scratch / "profiles" / f"{name}.toml")
        for (op, pages, mode), group in _groups(cases).items():
            rows = sorted({c.siblings for c in group})
            family = group[0].family
            exp = scratch / f"{experiment_name(family, mode)}.toml"
            exp.write_text(
                experiment_text(name, machine, pcid, op, pages, mode, rows, family),
                encoding="utf-8",
            )
            frame = api.run(exp, sets=list(sets), threads=threads)
            per_iteration = TWIN_OPS_PER_ITERATION.get(op, 1)
            total_ops = sum(iterations(op)) * per_iteration
            for c in group:
                part = frame[frame["row"] == c.siblings]
                values = part["value"].astype(float) / per_iteration
                ipis = part["c.tlb_shootdowns"].astype(float) / total_ops
                violations = [v for vs in part["violations"] for v in (vs or [])]
                out[c.name] = {
                    "median_us": float(values.median()),
                    "mean_us": float(values.mean()),
                    "stdev_us": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                    "tlb_ipis_per_op": float(ipis.mean()),
                    "violations": violations,
                }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
