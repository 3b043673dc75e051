"""Ctrl-C and SIGTERM: a check stops within a second and says nothing was proved (exit 130);
reproduce, run and sweep say what was kept and how to resume. Real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import popen_ctrl_c, requires_native

pytestmark = [
    requires_native,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals"),
]

REPO = Path(__file__).resolve().parents[2]
# 14 M states under TSO: a search that runs for tens of seconds whatever the strategy.
LONG_CHECK = ["check", "flush_catchup_3cpu", "--memory-model", "tso", "--max-states", "40000000"]


def _interrupt(args, sig, after_s, cwd=None):
    """Start ``shootdown ARGS``, send ``sig`` after ``after_s``, return (process, seconds from
    the signal to its exit, stderr)."""
    proc = popen_ctrl_c(
        [sys.executable, "-m", "shootdown", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    time.sleep(after_s)
    assert proc.poll() is None, "finished before the signal: " + proc.stderr.read()
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc, time.monotonic() - sent, err


@pytest.mark.parametrize(
    "strategy, sig",
    [
        ("auto", signal.SIGINT),
        ("parallel", signal.SIGTERM),
        ("bfs", signal.SIGINT),
        ("random", signal.SIGTERM),
    ],
)
def test_check_stops_within_a_second(strategy, sig) -> None:
    args = LONG_CHECK + ["--strategy", strategy]
    if strategy == "random":
        args += ["--sample", "100000000"]
    proc, took, err = _interrupt(args, sig, 2.5)
    assert proc.returncode == 130, err
    assert took < 1.0, f"took {took:.2f} s to stop"
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("shootdown: interrupted after ") and "nothing was proved" in last, err
    states = int(last.split("after ")[1].split(" states")[0])
    assert states > 0


def test_reproduce_says_nothing_was_kept() -> None:
    proc, took, err = _interrupt(["reproduce", "--quick"], signal.SIGINT, 1.5)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "shootdown: interrupted: no output was written and nothing is cached "
        "(`shootdown sweep` caches points)"
    )


def test_sweep_says_where_it_resumes_from(tmp_path: Path) -> None:
    args = [
        "sweep",
        str(REPO / "experiments" / "seeds" / "seed000-sysbench-no-mitigations.toml"),
        "--grid",
        "profile_override.cost.ipi_latency_same_socket=600,800,1000,1200,1400,1600",
        "--cache",
        str(tmp_path / "cache"),
        "--threads",
        "1",
    ]
    proc, took, err = _interrupt(args, signal.SIGTERM, 3.0, cwd=tmp_path)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("shootdown: interrupted: the points finished so far are cached in ")
    assert "the same command resumes" in last
