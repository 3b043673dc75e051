"""``sweep(backend="ray")`` on a real two-node Ray cluster on this machine.

The module starts a head node and a worker node with ``ray start`` (one CPU each, loopback
addresses only, no dashboard, no usage statistics, a temp dir of its own), runs a small sweep
on the cluster and locally and compares every number, then stops exactly the processes it
started — their process groups and everything they spawned — and checks that none is left.
It does not run ``ray stop``: that stops every Ray process of the machine, a user's own
cluster included.

Needs the real native module (Ray's workers import ``shootdown`` from this interpreter) and
``ray`` (the ``test`` extra installs it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest
from conftest import requires_native

from shootdown import _bridge, sweep

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
        self.port = _free_port()
        self.address = f"{HEAD_IP}:{self.port}"
        self.groups: List[int] = []
        self.seen: Set[int] = set()
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        self.env.pop("RAY_ADDRESS", None)
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
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A running two-node cluster, the test process connected to it as a driver."""
    if _bridge._override is not None:  # pragma: no cover - a leaked fake
        pytest.fail("a fake native module is installed")
    nodes = LocalCluster()
    old_env: Optional[str] = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    try:
        nodes.start()
        ray.init(address=nodes.address, _node_ip_address=HEAD_IP, logging_level="WARNING")
        yield nodes
    finally:
        nodes.stop()
        if old_env is None:
            os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
        else:
            os.environ["RAY_USAGE_STATS_ENABLED"] = old_env


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


def test_stopping_leaves_no_ray_process(cluster: LocalCluster) -> None:
    assert cluster.ours(), "found none of the cluster's processes while it runs"
    cluster.stop()
    assert not ray.is_initialized()
    assert cluster.leftovers == []
    assert not Path(cluster.temp_dir).exists()
