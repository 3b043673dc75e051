"""`shootdown check --set`: a scenario's keys overridden, `cpus=N` growing it (with a note that
says what was added), and bad keys as one-line errors."""

from __future__ import annotations

import subprocess
import sys

from conftest import requires_native


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shootdown", "check", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@requires_native
def test_set_grows_a_scenario_and_says_so() -> None:
    done = _check("pv_tlb_flush", "--set", "cpus=3", "--format", "json")
    assert done.returncode == 0, done.stderr
    import json

    r = json.loads(done.stdout)
    assert r["verdict"] == "verified" and r["states"] == 36_948
    assert r["notes"][0] == "--set cpus=3: cpu2 runs a copy of cpu1's tasks (reader)"


@requires_native
def test_bad_set_is_one_line() -> None:
    done = _check("smp_call_concurrent", "--set", "tasks.7.cpu=1")
    assert done.returncode == 2
    err = done.stderr.strip()
    assert err.endswith("tasks.7.cpu: 'tasks' is an array of 3: index it with 0 to 2"), err
    assert len(err.splitlines()) == 1
