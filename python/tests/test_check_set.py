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


@requires_native
def test_a_mutant_the_configuration_never_runs_is_unreached() -> None:
    # inc_tlb_gen_after_ipis lives in the concurrent flush; the older form never runs it.
    done = _check(
        "smp_call_concurrent",
        "--mutant",
        "inc_tlb_gen_after_ipis",
        "--set",
        "options.smp_call=remote_then_local",
    )
    assert done.returncode == 4, done.stderr
    assert done.stdout.startswith("verdict: unreached\n"), done.stdout
    assert "note: mutant inc_tlb_gen_after_ipis never ran: " in done.stdout
