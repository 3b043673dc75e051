"""scripts/test.sh, run with stub ``cargo`` and ``python3`` first on its PATH: it builds and
tests nothing, but says which suites it runs, in which order, and how it ends."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test.sh"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or not SCRIPT.is_file(), reason="needs bash and the source tree"
)

# A stub prints and logs the command it stands for, and fails (exit 101, as a failed
# `cargo test` does) when its arguments contain $STUB_FAIL_ON.
STUB = """#!/bin/sh
echo "{name} $*" >> "$STUB_LOG"
echo "stub: {name} $*"
case " $* " in
    *"${{STUB_FAIL_ON:-@never@}}"*) echo "stub: {name} fails" >&2; exit 101 ;;
esac
exit 0
"""


def crates() -> List[str]:
    """The workspace's packages, in Cargo.toml's order, but the Python extension."""
    members = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]
    names = [
        tomllib.loads((ROOT / m / "Cargo.toml").read_text())["package"]["name"] for m in members
    ]
    return [n for n in names if n != "shootdown-py"]


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, log: Path) -> None:
        self.code = proc.returncode
        self.out: str = proc.stdout
        self.err: str = proc.stderr
        self.lines = self.out.splitlines()
        self.calls = log.read_text().splitlines() if log.exists() else []

    @property
    def summary(self) -> str:
        assert len(self.lines) >= 2, self.err
        assert self.lines[-2].startswith("summary: "), self.out
        return self.lines[-2]

    @property
    def counts(self) -> str:
        """The last line: the suites as counts, in the plain closing form of test runners."""
        assert self.lines[-1].startswith("suites: "), self.out
        return self.lines[-1]


@pytest.fixture
def run_script(tmp_path):
    """Run scripts/test.sh with ARGS, stubs of cargo and python3 first on the PATH."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("cargo", "python3"):
        stub = stubs / name
        stub.write_text(STUB.format(name=name))
        stub.chmod(0o755)
    log = tmp_path / "calls.log"

    def run(*args: str, fail_on: Optional[str] = None) -> Run:
        env: Dict[str, str] = {
            **os.environ,
            "PATH": f"{stubs}{os.pathsep}{os.environ.get('PATH', '')}",
            "STUB_LOG": str(log),
        }
        env.pop("STUB_FAIL_ON", None)
        if fail_on is not None:
            env["STUB_FAIL_ON"] = fail_on
        log.unlink(missing_ok=True)
        proc = subprocess.run(
            ["bash", str(SCRIPT), *args],
            cwd=tmp_path,  # the script goes to the repository root itself
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return Run(proc, log)

    return run


#: The suites after each crate's own: (the command the script runs, the suite's name).
AFTER_CRATES = [
    (
        "cargo test -p shootdown-engine --features phase-timing --quiet",
        "cargo shootdown-engine[phase-timing]",
    ),
    (
        "cargo test -p shootdown-experiments --features phase-timing --test phase_timing --quiet",
        "cargo shootdown-experiments[phase-timing]",
    ),
    ("python3 -m pip install --quiet .[test]", "pip install"),
    ("python3 -m pytest -q python/tests", "pytest"),
]


def expected_calls() -> List[str]:
    return [f"cargo test -p {c} --quiet" for c in crates()] + [cmd for cmd, _ in AFTER_CRATES]


def suite_names() -> List[str]:
    return [f"cargo {c}" for c in crates()] + [name for _, name in AFTER_CRATES]


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_runs_nothing(run_script, flag) -> None:
    run = run_script(flag)
    assert run.code == 0, run.err
    assert run.out.startswith("usage: scripts/test.sh [-h | --help]")
    for words in ("cargo test -p CRATE", "shootdown-py", "phase-timing", "pytest", "summary"):
        assert words in run.out
    assert "-h, --help" in run.out
    assert run.calls == []  # no suite started: no header line, no summary line
    assert not any(line.startswith(("== ", "summary: ")) for line in run.lines)


def test_an_unknown_argument_runs_nothing(run_script) -> None:
    run = run_script("--fast")
    assert run.code == 2 and run.calls == []
    assert run.err.strip() == "scripts/test.sh: unknown argument: --fast (try --help)"


def test_every_suite_under_its_own_header_then_a_summary(run_script) -> None:
    run = run_script()
    assert run.code == 0, run.out + run.err
    assert "shootdown-engine" in crates() and "shootdown-py" not in crates()
    # Each crate on its own, in the workspace's order; never the extension, never the whole
    # workspace at once.
    assert run.calls == expected_calls()
    assert not any("shootdown-py" in c or "--workspace" in c for c in run.calls)
    # Each suite's header, then its own output, before the next header.
    headers = [i for i, line in enumerate(run.lines) if line.startswith("== ")]
    assert len(headers) == len(expected_calls())
    for k, call in enumerate(expected_calls()):
        start = headers[k]
        end = headers[k + 1] if k + 1 < len(headers) else len(run.lines) - 2
        assert run.lines[start + 1 : end] == [f"stub: {call}"], run.lines[start:end]
    for crate, start in zip(crates(), headers):
        assert run.lines[start] == f"== cargo test -p {crate}"
    assert run.lines[headers[-4]].startswith(
        "== cargo test -p shootdown-engine --features phase-timing"
    )
    assert run.lines[headers[-1]].startswith("== pytest")
    assert run.summary == "summary: " + ", ".join(f"{n} ok" for n in suite_names())
    assert run.summary.startswith("summary: cargo shootdown-engine ok, ")
    assert run.summary.endswith(", pip install ok, pytest ok")
    assert run.counts == f"suites: {len(suite_names())} passed, 0 failed, 0 skipped"


def test_the_first_failing_crate_stops_the_script(run_script) -> None:
    failing = crates()[2]
    run = run_script(fail_on=failing)
    assert run.code == 101, run.out + run.err
    assert run.calls == expected_calls()[:3]  # nothing after the failed suite
    names = suite_names()
    assert run.summary == "summary: " + ", ".join(
        [f"{n} ok" for n in names[:2]]
        + [f"cargo {failing} FAILED (exit 101)"]
        + [f"{n} not run" for n in names[3:]]
    )
    assert "stub: cargo fails" in run.err
    assert run.counts == f"suites: 2 passed, 1 failed, {len(names) - 3} skipped"


def test_a_failing_pytest_is_named_last(run_script) -> None:
    run = run_script(fail_on="pytest")
    assert run.code == 101
    assert run.calls == expected_calls()
    assert run.summary.endswith(", pip install ok, pytest FAILED (exit 101)")
    assert "not run" not in run.summary
    assert run.counts == f"suites: {len(suite_names()) - 1} passed, 1 failed, 0 skipped"
