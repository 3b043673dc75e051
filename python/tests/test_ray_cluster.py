"""``sweep(backend="ray")`` on a real two-node Ray cluster on this machine.

The module starts a head node and a worker node with ``ray start`` (one CPU each, loopback
addresses only, no dashboard, no usage statistics, a temp dir of its own), runs a small sweep
on the cluster and locally and compares every number, then stops exactly the processes it
started — their process groups and everything they spawned — and checks that none is left.
It does not run ``ray stop``: that stops every Ray process of the machine, a user's own
cluster included.

The cluster is hermetic: both ``ray start`` calls and the test process (the driver) see none
of the user's ``RAY_*`` variables, only the cluster's own — token authentication with a token
made for the run in ``RAY_AUTH_TOKEN``, which Ray prefers to ``RAY_AUTH_TOKEN_PATH`` and
``~/.ray/auth_token``, and ``RAY_TMPDIR`` inside the cluster's temp dir — and a ``HOME`` of
their own whose ``~/.ray/auth_token`` holds an unrelated token, so every run proves that a
token in the user's home (``sweep --backend ray`` used to leave one) changes nothing. The
CLI is run against the cluster with a wrong token, without one, and with the token in a file.

Needs the real native module (Ray's workers import ``shootdown`` from this interpreter) and
``ray`` (the ``test`` extra installs it).
"""

from __future__ import annotations

import importlib
import os
import secrets
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Set

import pytest
from conftest import requires_native

from shootdown import _bridge, sweep

sweep_mod = importlib.import_module("shootdown.sweep")

pytestmark = requires_native

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "experiments" / "seeds" / "seed003-mmtest-rom.toml"
GRID = {"workload.toggle_us": [50, 100]}
SETS = ["experiment.quick_rows=[1, 2]"]  # 2 rows × 3 variants × 1 repetition per combination
# Two loopback addresses, one per node. Ray turns 127.0.0.1 ("localhost") into the machine's
# outward address, other 127.0.0.0/8 addresses are used as given.
HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"
START_TIMEOUT_S = 120
# In the cluster's HOME: a token of some other cluster, as ``sweep --backend ray`` (Ray >= 2.59)
# used to leave in ~/.ray/auth_token. Nothing may read it, nothing may add to HOME.
UNRELATED_TOKEN = "0123456789abcdef" * 4


def _ray_free_env(**extra: str) -> Dict[str, str]:
    """This process's environment without any ``RAY_*`` variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(extra)
    return env


def _listing(root: Path) -> Dict[str, str]:
    """Every file and directory under ``root``: relative path → contents ("" for a dir)."""
    return {
        str(p.relative_to(root)): "" if p.is_dir() else p.read_text(errors="replace")
        for p in sorted(root.rglob("*"))
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))  # Ray's GCS listens on every interface: the port must be free on all
        return int(s.getsockname()[1])


def _procs() -> Dict[int, Dict[str, object]]:
    """Every process of the machine: pid → {ppid, pgid, state, cmdline}."""
    out: Dict[int, Dict[str, object]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = (
                Path(f"/proc/{entry}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode("utf-8", "replace")
            )
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry)] = {
            "state": fields[0],
            "ppid": int(fields[1]),
            "pgid": int(fields[2]),
            "cmdline": cmd,
        }
    return out


class LocalCluster:
    """A head and a worker node started by ``ray start`` in process groups of their own."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: socket paths
        self.home = Path(self.temp_dir) / "home"
        (self.home / ".ray").mkdir(parents=True)
        (self.home / ".ray" / "auth_token").write_text(UNRELATED_TOKEN)
        self.home_before = _listing(self.home)
        # Ray's default temp dir for these processes, were RAY_TMPDIR not set: never used.
        self.default_tmp = Path(os.environ.get("TMPDIR") or "/tmp") / "ray"
        self.default_tmp_existed = self.default_tmp.exists()
        self.home_after: Dict[str, str] = {}
        self.port = _free_port()
        self.address = f"{HEAD_IP}:{self.port}"
        self.token = secrets.token_hex(32)
        self.groups: List[int] = []
        self.seen: Set[int] = set()
        # Everything Ray reads that could differ between machines, set for both nodes and the
        # driver. PYTHONUSERBASE keeps the user's site-packages where the real HOME has them.
        self.env = _ray_free_env(
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            RAY_TMPDIR=self.temp_dir,
            HOME=str(self.home),
            PYTHONUSERBASE=site.getuserbase(),
        )
        self.start_seconds = 0.0
        self.stopped = False
        self.leftovers: List[str] = []

    def _ray_start(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", *args]
        proc = subprocess.Popen(
            cmd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its daemons share this new process group
        )
        self.groups.append(proc.pid)
        try:
            out, _ = proc.communicate(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0:
            tail = out.decode("utf-8", "replace").strip().splitlines()[-15:]
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n" + "\n".join(tail))

    def start(self) -> None:
        began = time.monotonic()
        # One CPU and the smallest object store Ray accepts (75 MB) per node: tasks return
        # small lists, and CI machines have little /dev/shm.
        common = ["--num-cpus=1", "--object-store-memory=80000000", "--disable-usage-stats"]
        self._ray_start(
            "--head",
            f"--node-ip-address={HEAD_IP}",
            f"--port={self.port}",
            "--include-dashboard=false",
            f"--temp-dir={self.temp_dir}",
            *common,
        )
        self._ray_start(f"--address={self.address}", f"--node-ip-address={WORKER_IP}", *common)
        self.start_seconds = time.monotonic() - began

    def ours(self) -> Set[int]:
        """Our processes: in our process groups, under our temp dir, or descended from one of
        them (Ray's workers start sessions of their own)."""
        procs = _procs()
        mine = {
            pid
            for pid, p in procs.items()
            if p["pgid"] in self.groups or self.temp_dir in str(p["cmdline"])
        }
        mine |= self.seen & set(procs)
        grew = True
        while grew:
            more = {pid for pid, p in procs.items() if p["ppid"] in mine} - mine
            grew = bool(more)
            mine |= more
        mine.discard(os.getpid())
        self.seen |= mine
        return {pid for pid in mine if procs.get(pid, {}).get("state") != "Z"}

    def stop(self) -> None:
        """Disconnect, then SIGTERM and (after a grace period) SIGKILL every process of ours;
        ``leftovers`` lists those still alive afterwards."""
        if self.stopped:
            return
        self.stopped = True
        if ray.is_initialized():
            ray.shutdown()
        for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 10.0)):
            for pid in self.ours():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while self.ours() and time.monotonic() < deadline:
                time.sleep(0.1)
        procs = _procs()
        self.leftovers = [f"{pid} {procs[pid]['cmdline'][:80]}" for pid in sorted(self.ours())]
        self.home_after = _listing(self.home)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _driver_env(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> None:
    """This process's environment as ``env`` for every ``RAY_*`` variable and ``HOME``, and
    Ray's in-process auth caches reloaded from it."""
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("RAY_") or key == "HOME":
            monkeypatch.setenv(key, value)
    sweep_mod._reload_ray_auth()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A running two-node cluster, the test process connected to it as a driver."""
    if _bridge._override is not None:  # pragma: no cover - a leaked fake
        pytest.fail("a fake native module is installed")
    nodes = LocalCluster()
    with pytest.MonkeyPatch.context() as monkeypatch:
        try:
            _driver_env(monkeypatch, nodes.env)
            nodes.start()
            ray.init(address=nodes.address, _node_ip_address=HEAD_IP, logging_level="WARNING")
            yield nodes
        finally:
            nodes.stop()
    sweep_mod._reload_ray_auth()  # the restored environment's settings


def _cli_sweep(
    cwd: Path, env: Mapping[str, str], address: Optional[str] = None
) -> subprocess.CompletedProcess:
    """``shootdown sweep --backend ray`` of 3 points in a process of its own."""
    cmd = [sys.executable, "-m", "shootdown", "sweep", str(EXPERIMENT), "--quick"]
    cmd += ["--set", "experiment.quick_rows=[1]", "--grid", "workload.toggle_us=50"]
    cmd += ["--backend", "ray", "--cache", str(cwd / "cache"), "--threads", "1"]
    if address is not None:
        cmd += ["--address", address]
    return subprocess.run(
        cmd, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=START_TIMEOUT_S
    )


def test_cluster_has_two_live_nodes(cluster: LocalCluster) -> None:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert sorted(n["NodeManagerAddress"] for n in nodes) == [HEAD_IP, WORKER_IP]
    assert all(n["Resources"].get("CPU") == 1.0 for n in nodes)

    def node_of_task() -> str:  # nested: shipped by value, the workers cannot import tests
        import shootdown._native  # noqa: F401 - the node loads the extension

        return str(ray.get_runtime_context().get_node_id())

    # Each node runs shootdown's extension (one task pinned to each).
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=1)(node_of_task)
    ids = [n["NodeID"] for n in nodes]
    pinned = [
        remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(i, soft=False)).remote()
        for i in ids
    ]
    assert ray.get(pinned, timeout=60) == ids
    assert cluster.start_seconds < START_TIMEOUT_S
    # It ran with an unrelated token in HOME: Ray took the cluster's own from RAY_AUTH_TOKEN.
    assert (cluster.home / ".ray" / "auth_token").read_text() == UNRELATED_TOKEN
    assert os.environ["HOME"] == str(cluster.home) and os.environ["RAY_AUTH_MODE"] == "token"


def test_ray_sweep_equals_local_sweep(cluster: LocalCluster, tmp_path: Path) -> None:
    local = sweep(EXPERIMENT, GRID, cache_dir=tmp_path / "local", sets=SETS, quick=True)
    remote = sweep(
        EXPERIMENT,
        GRID,
        backend="ray",
        cache_dir=tmp_path / "ray",
        sets=SETS,
        quick=True,
        threads=1,
        chunk_size=2,  # 12 points: 6 tasks over the two nodes
    )
    assert len(remote) == len(local) == 2 * 2 * 3
    assert not remote["cached"].any()
    keys = ["combo", "index", "row", "variant", "rep", "rng_seed"]
    numbers = ["value", "sim_ns", "steps"] + [c for c in local.columns if c.startswith("c.")]
    assert [c for c in local.columns if c.startswith("c.")], "no counters to compare"
    assert list(remote.columns) == list(local.columns)
    assert remote[keys].values.tolist() == local[keys].values.tolist()
    assert remote[numbers].values.tolist() == local[numbers].values.tolist()  # bit-identical
    assert remote["violations"].tolist() == local["violations"].tolist()
    # Resuming on the cluster reads every point from its cache.
    again = sweep(
        EXPERIMENT, GRID, backend="ray", cache_dir=tmp_path / "ray", sets=SETS, quick=True
    )
    assert again["cached"].all()


def test_a_wrong_token_is_one_line_naming_the_fix(cluster: LocalCluster, tmp_path: Path) -> None:
    wrong = dict(cluster.env, RAY_ADDRESS=cluster.address, RAY_AUTH_TOKEN="f" * 64)
    no_mode = {k: v for k, v in wrong.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    for env, sources in (
        (wrong, ["the token sent came from RAY_AUTH_TOKEN"]),
        # Ray 2.60 sends no token to an explicit address unless RAY_AUTH_MODE=token; should a
        # later one send ~/.ray/auth_token, the message must say so.
        (no_mode, ["RAY_AUTH_MODE is unset, so no token was sent", "came from ~/.ray/"]),
    ):
        began = time.monotonic()
        done = _cli_sweep(tmp_path, env)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr
        assert len(lines) == 1, done.stderr  # no traceback, none of Ray's retry messages
        assert lines[0].startswith(
            f"shootdown: error: the Ray cluster at {cluster.address} refused"
        ), lines
        assert any(src in lines[0] for src in sources), lines[0]
        assert "RAY_AUTH_MODE=token" in lines[0], lines[0]
        assert "RAY_AUTH_TOKEN_PATH" in lines[0] and "~/.ray/auth_token" in lines[0], lines[0]
        assert done.stdout == "" and time.monotonic() - began < 30  # ray.init retries for 20 s


def test_cli_sweep_with_the_clusters_token_in_a_file(cluster: LocalCluster, tmp_path: Path) -> None:
    token_file = tmp_path / "cluster-token"
    token_file.write_text(cluster.token + "\n")
    env = {k: v for k, v in cluster.env.items() if k != "RAY_AUTH_TOKEN"}
    env.update(RAY_AUTH_TOKEN_PATH=str(token_file))
    done = _cli_sweep(tmp_path, env, address=cluster.address)  # --address, not RAY_ADDRESS
    assert done.returncode == 0, done.stderr
    assert "0 of 3 points from the cache" in done.stderr
    assert "WARNING" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "mainline" in done.stdout


def test_stopping_leaves_no_ray_process(cluster: LocalCluster) -> None:
    assert cluster.ours(), "found none of the cluster's processes while it runs"
    cluster.stop()
    assert not ray.is_initialized()
    assert cluster.leftovers == []
    assert not Path(cluster.temp_dir).exists()
    # Nothing was added to the cluster's HOME (nor its token changed), by the nodes, the
    # driver or the CLI runs; nothing went to Ray's default temp dir.
    assert cluster.home_after == cluster.home_before
    assert cluster.default_tmp_existed or not cluster.default_tmp.exists()
