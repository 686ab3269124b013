"""The Ray executor on a started Ray cluster: `ray start --head` and a second `ray start --address`
on this machine, two nodes of one CPU each, driven by `batch --executor ray --ray-address`: ops
spread over the nodes, a node stopped while an op runs on it, resume. The cluster is stopped at
teardown and leaves no process."""

import contextlib
import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO, alive, pids_mentioning, wait_for

from harness.core import launch, paths

OPS = REPO / "tests" / "resources" / "batch_ops"
pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """Two Ray nodes on this machine, each a `ray start --block` process group of ours."""

    def __init__(self, state_dir: Path):
        # Short: Ray's unix sockets live under it. Every process of the cluster names it.
        self.temp = Path(tempfile.mkdtemp(prefix="zlray", dir="/tmp"))
        self.address = f"127.0.0.1:{free_port()}"
        # Token auth is not what these tests are about; the ops' own test state comes through the nodes.
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "ZL_TEST_STATE_DIR": str(state_dir)}
        self.env.pop("TRITON_INTERPRET", None)
        self.nodes = {}

    def start(self, name: str, *args) -> None:
        with open(self.temp.parent / f"{self.temp.name}_{name}.log", "w") as log:
            self.nodes[name] = subprocess.Popen(
                [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--num-cpus", "1",
                 "--node-ip-address", "127.0.0.1", "--disable-usage-stats", *args], env=self.env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def node_count(self) -> int:
        proc = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address='{self.address}', "
                               "configure_logging=False); print(len([n for n in ray.nodes() if n['Alive']]))"],
                              env=self.env, capture_output=True, text=True, timeout=120)
        return int(proc.stdout.split()[-1]) if proc.returncode == 0 and proc.stdout.split() else 0

    def kill(self, name: str) -> None:
        os.killpg(self.nodes[name].pid, signal.SIGKILL)
        self.nodes[name].wait()
        reap_group(self.nodes[name].pid)

    def stop(self) -> None:
        for name in reversed(list(self.nodes)):  # the worker node, then the head
            if self.nodes[name].poll() is None:
                os.killpg(self.nodes[name].pid, signal.SIGTERM)
        for proc in self.nodes.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reap_group(proc.pid)


def reap_group(pgid: int, timeout: float = 30) -> None:
    """Reap the processes of a stopped node's group that came to this pytest (the subreaper of what its
    tests start, tests/conftest.py), as init would. Ray's task workers run in groups of their own and
    outlive their raylet until they see it gone, which they check by its pid: a raylet left a zombie
    here would keep them running, finishing the tasks of a node that was stopped."""
    def members() -> list[tuple[int, str]]:
        found = []
        for pid in launch.children():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                found.append((pid, fields[0]))
        return found

    deadline = time.monotonic() + timeout
    while (left := members()) and time.monotonic() < deadline:
        for pid, state in left:
            if state == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        time.sleep(0.1)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    c.start("head", "--head", "--port", c.address.rpartition(":")[2], "--temp-dir", str(c.temp),
            "--include-dashboard", "false")
    c.start("worker", "--address", c.address)
    try:
        assert wait_for(lambda: c.node_count() == 2, 180, interval=3), "the two Ray nodes did not come up"
        yield c
    finally:
        c.stop()
        left = wait_for(lambda: not pids_mentioning(str(c.temp)), 30)
        assert left, f"processes of the Ray cluster left: {pids_mentioning(str(c.temp))}"
        shutil.rmtree(c.temp, ignore_errors=True)
        for log in c.temp.parent.glob(f"{c.temp.name}_*.log"):
            log.unlink()


def batch(cluster: Cluster, tmp_path: Path, *args) -> subprocess.Popen:
    env = {k: v for k, v in cluster.env.items()}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return subprocess.Popen([sys.executable, "-m", "harness", "batch", "--backend", "interpreter", "--ops-path",
                             str(OPS), "--executor", "ray", "--ray-address", cluster.address,
                             "--batch-dir", str(tmp_path / "b"), *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def raylet_of(pid: int) -> int | None:
    """The raylet (one per node) that pid descends from."""
    while pid > 1:
        try:
            if b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                return pid
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return None
    return None


def statuses(batch_dir: Path) -> dict[str, dict]:
    with open(batch_dir / "ops_status.csv", newline="") as f:
        return {r["op"]: r for r in csv.DictReader(f)}


def test_ops_spread_over_the_nodes_and_an_op_whose_node_died_runs_again(cluster, tmp_path):
    proc = batch(cluster, tmp_path, "--ops", "slow_op", "slower_op", "--op-timeout", 300)
    markers = lambda: list(tmp_path.glob("slow_started_*"))  # noqa: E731
    assert wait_for(lambda: len(markers()) == 2, 240), (proc.poll(), markers())
    # Both run at once, one per node (one CPU each): each under its own node's raylet.
    raylets = {raylet_of(int(m.name.rpartition("_")[2])) for m in markers()}
    assert len(raylets) == 2 and None not in raylets, raylets
    cluster.kill("worker")  # the node, all at once, with an op running on it
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    d = tmp_path / "b"
    st = statuses(d)
    assert {op: r["status"] for op, r in st.items()} == {"slow_op": "PASS", "slower_op": "PASS"}, st
    again = [r for r in st.values() if r["notes"].startswith("ran again after its Ray task was lost (")]
    assert len(again) == 1, st  # the op on the dead node, not lost: run again on the node left
    for op in st:
        assert "ran on Ray node " in (d / "ops" / f"path__{op}" / "batch.log").read_text()
    # The killed node's task left its scratch dir: a private dir, which the next one made there removes.
    paths.remove_abandoned()
    scratch = [p.name for p in Path(tempfile.gettempdir()).glob("zl_ray_op*")]
    assert all(re.match(r"zl_ray_op\.(\d+)\.", n) and alive(int(n.split(".")[1])) for n in scratch), scratch
    ours = ("batch dir: ", "2 selected, ", "PASS ", "done: ")  # Ray's own lines go to the batch's log
    assert all(line.startswith(ours) for line in out.splitlines()), out
    resumed = batch(cluster, tmp_path, "--resume")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0 and "2 selected, 2 already done" in out, out
