"""Shared fixtures: a fake native module, a throw-away data home, a CLI runner.

Tests that need the real Rust extension use the ``requires_native`` marker below: they are
skipped only when ``shootdown._native`` cannot be imported.
"""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator, List

import pytest

try:
    import shootdown  # noqa: F401
except ImportError:  # running from a source tree without installing: use python/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import shootdown  # noqa: F401

from fake_native import FakeNative

from shootdown import _bridge


def popen_ctrl_c(args: List[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` whose child takes SIGINT as it would from a terminal's Ctrl-C, even
    when this test run was started in the background: a shell starts background jobs with
    SIGINT ignored, children inherit that, and Python then installs no KeyboardInterrupt."""

    def default_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    return subprocess.Popen(args, preexec_fn=default_sigint, **kwargs)


def native_importable() -> bool:
    try:
        importlib.import_module("shootdown._native")
    except ImportError:
        return False
    return True


requires_native = pytest.mark.skipif(
    not native_importable(), reason="the Rust extension shootdown._native is not built"
)


@pytest.fixture
def fake_native() -> Iterator[FakeNative]:
    """Route every native call to a :class:`FakeNative` for the duration of a test."""
    fake = FakeNative()
    old = _bridge.set_native_override(fake)
    try:
        yield fake
    finally:
        _bridge.set_native_override(old)


SEED_000 = """
[experiment]
name = "seed000-test"
seed = "000"
title = "sysbench fileio rndwr (fake)"
profile = "test-profile"
metric = "events"
unit = "events/10s"
repetitions = 3
quick_repetitions = 2
row_key = "threads"
rows = [1, 2, 4, 8]
quick_rows = [1, 8]
higher_is_better = true

[workload]
kind = "fake"
fake_noise = 1.0

[variants.before]
label = "tip-jun28"
options = { fake_factor = 1.0 }

[variants.after]
label = "+patch-set"
options = { fake_factor = 1.05 }

[[published]]
row = 1
variant = "before"
value = 1267765
stdev = 14146

[[published]]
row = 1
variant = "after"
value = 1299253
stdev = 5715

[[published]]
row = 8
variant = "before"
value = 4171652
stdev = 31243

[[published]]
row = 8
variant = "after"
value = 4000000
stdev = 65416
"""

SEED_002 = """
[experiment]
name = "seed002-test"
seed = "002"
title = "MADV_DONTNEED + migrate (fake)"
profile = "test-profile"
metric = "latency"
unit = "µs"
repetitions = 2
quick_repetitions = 1
row_key = "case"
rows = ["dontneed"]
higher_is_better = false

[workload]
kind = "fake"

[variants.unpatched]
label = "unpatched"
options = { fake_factor = 1.0 }

[variants.patched]
label = "patched"
options = { fake_factor = 0.6 }

[[published]]
row = "dontneed"
variant = "unpatched"
value = 21.6

[[published]]
row = "dontneed"
variant = "patched"
value = 13.4
"""

PROFILE = """
[profile]
name = "test-profile"
description = "fake"
"""


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root with two seed experiments, a profile and two scenarios; $SHOOTDOWN_HOME."""
    root = tmp_path / "home"
    (root / "experiments" / "seeds").mkdir(parents=True)
    (root / "profiles").mkdir()
    (root / "scenarios").mkdir()
    (root / "experiments" / "seeds" / "000-sysbench.toml").write_text(textwrap.dedent(SEED_000))
    (root / "experiments" / "seeds" / "002-dontneed.toml").write_text(textwrap.dedent(SEED_002))
    (root / "profiles" / "test-profile.toml").write_text(textwrap.dedent(PROFILE))
    (root / "scenarios" / "lazy-switch.toml").write_text("[scenario]\nname = 'lazy-switch'\n")
    (root / "scenarios" / "pv-flush.toml").write_text("[scenario]\nname = 'pv-flush'\n")
    monkeypatch.setenv("SHOOTDOWN_HOME", str(root))
    return root


@pytest.fixture
def seed000(data_home: Path) -> Path:
    return data_home / "experiments" / "seeds" / "000-sysbench.toml"


@pytest.fixture
def runner():
    """A CLI runner that keeps stdout and stderr apart (old and new click/typer)."""
    from typer.testing import CliRunner

    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()
