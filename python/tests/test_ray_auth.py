"""``sweep(backend="ray")`` without an address: a private local Ray instance that leaves the
user's home and environment as they were.

Ray (2.59 and later) turns token authentication on for a local ``ray.init()`` when
``RAY_AUTH_MODE`` is unset, warns about it, and writes a new ``~/.ray/auth_token`` when it
finds no token — a file that then made the next two-node ``ray start`` (the cluster test) fail
with ``InvalidAuthToken``. The sweep runs here in a process of its own, ``RAY_TMPDIR`` in a
temporary directory and ``HOME`` a temporary directory as a new user has it (empty, no ``RAY_*``
variable) or as a user with a cluster of their own might (an unrelated token in
``~/.ray/auth_token`` and ``RAY_AUTH_TOKEN_PATH``): afterwards the home is unchanged, Ray
printed no warning, the auth variables are back as they were, and no process of the instance
is left.

Needs the real native module and ``ray`` (the ``test`` extra installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import pytest
from conftest import requires_native

pytestmark = requires_native

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "experiments" / "seeds" / "seed003-mmtest-rom.toml"
UNRELATED_TOKEN = "0123456789abcdef" * 4

SCRIPT = """
import json, os, sys
import ray
from shootdown import sweep

KEYS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
during = []

def progress(done, total):
    during.append({k: os.environ.get(k) for k in KEYS})

frame = sweep(
    sys.argv[1], {"workload.toggle_us": [50]}, backend="ray", cache_dir="cache",
    sets=["experiment.quick_rows=[1]"], quick=True, threads=1, progress=progress,
)
print(json.dumps({
    "points": len(frame),
    "cached": int(frame["cached"].sum()),
    "during": during[-1],
    "after": {k: os.environ.get(k) for k in KEYS},
    "initialized": ray.is_initialized(),
}))
"""


def _listing(root: Path) -> Dict[str, str]:
    """Every file and directory under ``root``: relative path → contents ("" for a dir)."""
    return {
        str(p.relative_to(root)): "" if p.is_dir() else p.read_text(errors="replace")
        for p in sorted(root.rglob("*"))
    }


def _processes_mentioning(text: str) -> List[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().decode("utf-8", "replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmd and state != "Z":
            pids.append(int(entry))
    return pids


@pytest.mark.parametrize("user", ["new", "with-a-cluster-token"])
def test_local_ray_sweep_leaves_home_and_environment_alone(user: str, tmp_path: Path) -> None:
    ray_tmp = tempfile.mkdtemp(prefix="rayauth", dir="/tmp")  # short: Ray's socket paths
    try:
        home = tmp_path / "home"
        home.mkdir()
        work = tmp_path / "work"
        work.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(
            HOME=str(home),
            PYTHONUSERBASE=site.getuserbase(),  # the user's site-packages, as under $HOME
            RAY_TMPDIR=ray_tmp,
            RAY_USAGE_STATS_ENABLED="0",
        )
        own_token = None
        if user == "with-a-cluster-token":
            (home / ".ray").mkdir()
            (home / ".ray" / "auth_token").write_text(UNRELATED_TOKEN)
            own_token = str(tmp_path / "my-cluster-token")
            Path(own_token).write_text(UNRELATED_TOKEN)
            env["RAY_AUTH_TOKEN_PATH"] = own_token
        before = _listing(home)
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(EXPERIMENT)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["points"] == 3 and out["cached"] == 0
        # The instance ran in token mode with a token of its own, in the environment only.
        assert out["during"]["RAY_AUTH_MODE"] == "token"
        assert out["during"]["RAY_AUTH_TOKEN"] not in (None, UNRELATED_TOKEN)
        assert out["during"]["RAY_AUTH_TOKEN_PATH"] is None
        # ... and was stopped, the user's settings restored.
        assert not out["initialized"]
        assert out["after"] == {
            "RAY_AUTH_MODE": None,
            "RAY_AUTH_TOKEN": None,
            "RAY_AUTH_TOKEN_PATH": own_token,
        }
        # No warning the user cannot act on, nothing about tokens at all.
        assert "WARNING" not in done.stderr and "token" not in done.stderr.lower(), done.stderr
        # Nothing written under HOME or in the working directory but the cache; Ray's session
        # went to RAY_TMPDIR.
        assert _listing(home) == before
        assert [p.name for p in work.iterdir()] == ["cache"]
        assert list((Path(ray_tmp) / "ray").glob("session_*"))
        # No process of the instance outlives the sweep.
        deadline = time.monotonic() + 10
        while _processes_mentioning(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _processes_mentioning(ray_tmp)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert left == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_an_unreadable_token_file_is_one_line_before_connecting(tmp_path: Path) -> None:
    """Ray's C++ core ends the process without a word when RAY_AUTH_TOKEN_PATH names a missing
    or empty file: the sweep checks the token first."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))  # nothing will listen there: no connection is tried
        address = f"127.0.0.2:{sock.getsockname()[1]}"
    missing = tmp_path / "no-such-token"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        HOME=str(tmp_path),
        PYTHONUSERBASE=site.getuserbase(),
        RAY_ADDRESS=address,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(missing),
    )
    cmd = [sys.executable, "-m", "shootdown", "sweep", str(EXPERIMENT), "--quick"]
    cmd += ["--grid", "workload.toggle_us=50", "--backend", "ray", "--cache", "cache"]
    began = time.monotonic()
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"shootdown: error: no usable auth token for the Ray cluster at {address} "
        f"(RAY_AUTH_TOKEN_PATH is set but file cannot be opened or is empty: {missing}): "
        "run with RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN or in a file "
        "named by RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token); `ray get-auth-token` on the "
        "head node prints it"
    ]
    assert time.monotonic() - began < 30
    assert sorted(p.name for p in tmp_path.iterdir()) == []
