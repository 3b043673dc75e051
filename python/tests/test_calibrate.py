"""``shootdown calibrate`` / ``validate``: the cases, the simulated twin, the fit, and the
commands on this machine (real measurements with tiny budgets: a smoke test of the pipeline,
never an accuracy assertion — accuracy is a benchmark recorded in docs/validation.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import popen_ctrl_c, requires_native

from shootdown import calibrate, hostcases, twin
from shootdown.hostcases import Case

# Tiny budgets: a repetition of 2 ms, three of them.
FAST = ["--reps", "3", "--target-ms", "2"]


def test_cases_for_two_and_four_cpus() -> None:
    two = hostcases.shootdown_cases(2)
    # 4 families × (T0, T1 busy, T1 sleeping)
    assert len(two) == 12
    assert [c.name for c in two[:3]] == [
        "madvise-1/T0",
        "madvise-1/T1-busy",
        "madvise-1/T1-sleeping",
    ]
    assert "munmap-2M/T1-sleeping" in {c.name for c in two}
    four = hostcases.shootdown_cases(4)
    assert len(four) == 4 * (1 + 3 * 2)
    assert max(c.siblings for c in four) == 3
    cal = hostcases.calibration_cases(2)
    assert [c.name for c in cal] == [
        "null_syscall",
        "fault",
        "ctx_switch",
        "wake_ipi",
        "migrate",
        "madvise-1/T0",
        "madvise-1/T1-busy",
    ]
    one = [c.name for c in hostcases.calibration_cases(1)]
    assert one == ["null_syscall", "fault", "ctx_switch", "madvise-1/T0"]


GUEST_HOST = {
    "cpu_model": "test CPU",
    "kernel_release": "6.18-test",
    "online_cpus": [0, 1],
    "online_cpu_count": 2,
    "sockets": 1,
    "cores_per_socket": 2,
    "threads_per_core": 1,
    "idle_poll": False,
    "pcid": True,
    "invpcid": True,
    "mitigations": {},
    "hypervisor": "KVMKVMKVM",
    "kvm_features": {"pv_tlb_flush": True, "pv_send_ipi": True},
}


def _result(us: float) -> dict:
    return {"median_us": us, "min_us": us, "max_us": us, "us_per_op": [us] * 3}


@requires_native
def test_the_fit_recovers_the_scales_a_profile_was_made_with(tmp_path: Path) -> None:
    """Make "measurements" by simulating the twins on a profile with known page, call and IPI
    scales; fitting them must give those scales back (the fit inverts the model)."""
    primitives = {
        "null_syscall": _result(0.2),
        "ctx_switch": _result(2.5),
        "wake_ipi": _result(40.0),
        "migrate": _result(25.0),
    }
    truth = calibrate.Calibration(GUEST_HOST, primitives, calibrate.base_profile_name(True))
    base = calibrate._resolved_costs(truth.base)
    truth.costs["syscall_entry_exit"] = calibrate.FittedCost(200.0, "t")
    truth.costs["user_touch_page"] = calibrate.FittedCost(base["l1_hit"], "t")
    scales = {"page": 1.7, "call": 0.8, "IPI": 0.6}
    for label, keys in (
        ("page", calibrate.PAGE_GROUP),
        ("call", calibrate.CALL_GROUP),
        ("IPI", calibrate.GUEST_IPI_GROUP),
    ):
        for k in keys:
            truth.costs[k] = calibrate.FittedCost(base[k] * scales[label], "t")
    path = tmp_path / "truth.toml"
    calibrate.write_profile(truth, path)
    cases = [
        Case("fault", hostcases.FAULT_PAGES),
        Case("madvise", 1, 0),
        Case("madvise", 1, 1, "busy"),
    ]
    sim = twin.simulate(path, cases, threads=1)
    measured = dict(primitives)
    for c in cases:
        measured[c.name] = _result(sim[c.name]["mean_us"])
    cal = calibrate.fit_profile(GUEST_HOST, measured)
    for label, want in scales.items():
        assert cal.scales[label] == pytest.approx(want, rel=0.01), label
    assert not cal.warnings
    assert cal.costs["syscall_entry_exit"].value == pytest.approx(200.0)
    assert cal.costs["page_zero"].fitted == ["host/fault"]
    assert cal.costs["invlpg"].fitted == ["validate-madvise-1-busy/calibrated/0"]
    assert cal.costs["ipi_send"].fitted == ["validate-madvise-1-busy/calibrated/1"]
    assert cal.costs["user_touch_page"].fitted == []
    # The profile written from the fit loads, and its twins give the measured numbers back.
    out = tmp_path / "fit.toml"
    calibrate.write_profile(cal, out)
    again = twin.simulate(out, cases, threads=1)
    for c in cases:
        assert again[c.name]["mean_us"] == pytest.approx(measured[c.name]["median_us"], rel=0.01)


def test_the_linear_solve() -> None:
    assert calibrate._solve([[2.0, 1.0], [1.0, 3.0]], [3.0, 5.0]) == pytest.approx([0.8, 1.4])
    assert calibrate._solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0]) is None  # singular


@requires_native
def test_twin_experiments_load_for_every_case(tmp_path: Path) -> None:
    cal = calibrate.Calibration(GUEST_HOST, {}, calibrate.base_profile_name(True))
    path = tmp_path / "p.toml"
    calibrate.write_profile(cal, path)
    sim = twin.simulate(path, hostcases.shootdown_cases(2), threads=1)
    assert len(sim) == 12
    assert sim["madvise-1/T1-busy"]["tlb_ipis_per_op"] == pytest.approx(1.0, abs=0.01)
    assert sim["mprotect-8/T1-busy"]["tlb_ipis_per_op"] == pytest.approx(2.0, abs=0.01)
    assert sim["madvise-1/T1-sleeping"]["tlb_ipis_per_op"] < 0.01
    assert all(not s["violations"] for s in sim.values())


def _shootdown(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shootdown", *args],
        capture_output=True,
        text=True,
        timeout=300,
        **kw,
    )


@requires_native
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="measures a Linux host")
def test_calibrate_then_validate_on_this_machine(tmp_path: Path) -> None:
    profile = tmp_path / "host.toml"
    r = _shootdown("calibrate", "--out", str(profile), *FAST)
    assert r.returncode == 0, r.stderr
    assert "syscall_entry_exit" in r.stdout
    text = profile.read_text()
    assert "[machine]" in text and "fitted = [" in text
    out = tmp_path / "v.json"
    r = _shootdown(
        "validate", "--profile", str(profile), "--format", "json", "--out", str(out), *FAST
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    cpus = len(os.sched_getaffinity(0))
    assert len(doc["cases"]) == len(hostcases.shootdown_cases(cpus))
    fitted = [c["case"] for c in doc["cases"] if c["fitted"]]
    assert fitted == (["madvise-1/T0", "madvise-1/T1-busy"] if cpus > 1 else ["madvise-1/T0"])
    assert doc["summary"]["predicted"] == len(doc["cases"]) - len(fitted)
    assert all(c["sim_us"] > 0 and c["real_us"] > 0 for c in doc["cases"])
    r = _shootdown("validate", "--profile", str(profile), *FAST)
    assert r.returncode == 0, r.stderr
    assert "predicted cells:" in r.stdout and "calibration input" in r.stdout
    pytest.importorskip("matplotlib")
    fig = tmp_path / "v.svg"
    r = _shootdown("plot", "--from-json", str(out), "--out", str(fig))
    assert r.returncode == 0, r.stderr
    assert fig.stat().st_size > 1000


@requires_native
@pytest.mark.parametrize(
    "content, expect",
    [
        (None, "cannot read"),
        ("[profile]\nname = 'x'\n", "machine: missing: not a calibrated profile"),
        ("[profile\n", "malformed TOML"),
    ],
)
def test_validate_bad_profiles_are_one_line_errors(tmp_path: Path, content, expect) -> None:
    path = tmp_path / "bad.toml"
    if content is not None:
        path.write_text(content)
    r = _shootdown("validate", "--profile", str(path), *FAST)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(path) in lines[0] and expect in lines[0]


@requires_native
def test_calibrate_into_a_missing_directory_fails_before_measuring(tmp_path: Path) -> None:
    r = _shootdown("calibrate", "--out", str(tmp_path / "no" / "such" / "p.toml"))
    assert r.returncode == 2
    assert "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@requires_native
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="measures a Linux host")
def test_ctrl_c_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "p.toml"
    proc = popen_ctrl_c(
        [sys.executable, "-m", "shootdown", "calibrate", "--out", str(out), "--target-ms", "2000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3.0)  # inside the first repetitions
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "nothing was written" in err and "Traceback" not in err
    assert not out.exists()
    assert not list(tmp_path.iterdir())


@requires_native
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
@pytest.mark.parametrize("command", ["calibrate", "validate"])
def test_one_cpu_is_a_one_line_error(tmp_path: Path, command: str) -> None:
    code = (
        "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from shootdown.cli import main; main(sys.argv[1:])"
    )
    args = ["--out", str(tmp_path / "p.toml")] if command == "calibrate" else []
    if command == "validate":
        cal = calibrate.Calibration(GUEST_HOST, {}, calibrate.base_profile_name(True))
        calibrate.write_profile(cal, tmp_path / "p.toml")
        args = ["--profile", str(tmp_path / "p.toml")]
    r = subprocess.run(
        [sys.executable, "-c", code, command, *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "at least 2" in lines[0], r.stderr
