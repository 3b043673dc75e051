"""`check` shows its progress (states, states/s, the deepest path or the frontier) on stderr,
and a bound that was reached says how far the search got and which bound to try next."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import requires_native


@requires_native
def test_check_progress_goes_to_stderr_and_the_bound_note_suggests_a_bound() -> None:
    # The line is first drawn after half a second: the search must run well past that on a
    # fast machine too (900,000 of the 920,860 TSO states take about 1.3 s on 2 cores here,
    # depth-first; 150,000 SC states once took 0.65 s, and sometimes under 0.5 s).
    code = (
        "import json, shootdown\n"
        "r = shootdown.check('smp_call_concurrent', memory_model='tso', max_states=900_000,"
        " progress=True)\n"
        "print(json.dumps(r['notes']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert "checking: " in done.stderr and "states/s, depth-first, deepest path " in done.stderr
    assert done.stderr.endswith("\x1b[K"), repr(done.stderr[-40:])  # erased at the end
    assert "checking" not in done.stdout
    assert "checking: " in done.stderr and " of at most 900000 states, " in done.stderr
    notes = done.stdout
    # Depth-first search has no levels to extrapolate from: the hint says so.
    assert "900000 stored, paths " in notes and "try --max-states 9000000" in notes
    assert "breadth-first search estimates it" in notes


@requires_native
def test_breadth_first_hint_extrapolates_the_level_sizes() -> None:
    # smp_call_concurrent under TSO has 920,860 states (parallel breadth-first, as depth-first);
    # stopped at 800,000 the shrinking last levels extrapolate to about that many (995,640; the
    # hint adds a quarter). The level sizes do not depend on the number of threads.
    import shootdown

    r = shootdown.check(
        "smp_call_concurrent", memory_model="tso", max_states=800_000, strategy="parallel"
    )
    assert r["verdict"] == "bound-reached" and r["max_states"] == 800_000
    hint = r"extrapolates to about (\d+) states in all: try --max-states (\d+)"
    m = re.search(hint, r["notes"][0])
    assert m, r["notes"]
    assert 920_860 <= int(m.group(2)) <= 2 * 920_860, m.group(0)


@requires_native
def test_default_bound_comes_from_memory() -> None:
    import shootdown

    r = shootdown.check("pv_tlb_flush")
    assert r["verdict"] == "verified" and r["max_states"] >= 1_000_000


@requires_native
def test_no_progress_unless_asked() -> None:
    code = "import shootdown\nshootdown.check('smp_call_concurrent', max_states=150_000)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert "checking" not in done.stderr
