"""One local multi-node Ray cluster for the whole test session: a head raylet plus a second
raylet on the same host with a custom resource, started with `ray start` and stopped at
the end. Token auth is set the same way on every `ray start` and in the driver.

Stopping it stops every process it started, and only those: `ray stop` would also end any
other Ray on the machine (another user's, another test session's). Each `ray start` runs in
a session of its own, which every process it spawns inherits (GCS, raylets, agents, the
client server, workers, actors); a process also counts as the cluster's when its command
line, an open file or its working directory lies in the cluster's temp dir (Ray titles
workers `ray::…`, so some never name it on the command line). The fixture's teardown
fails when any of them survives.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import pytest
from ports import free_port

AUTH_ENV = {"RAY_AUTH_MODE": "disabled"}
# Ray rewrites 127.0.0.1 to the host's routable address; another loopback address keeps
# every byte of the cluster's traffic on loopback.
NODE_IP = "127.0.0.2"


@dataclass
class LocalCluster:
    address: str
    node_resource: str  # each raylet has one unit of this custom resource: pins one engine actor per node
    temp_dir: str = ""
    sessions: list[int] = field(default_factory=list)  # session ids of its `ray start` runs

    def processes(self) -> list[int]:
        """Live pids of this cluster's processes (this test process excluded)."""
        return cluster_processes(self.temp_dir, self.sessions)

    def stop(self, grace_seconds: float = 10) -> list[int]:
        """SIGTERM every process of the cluster, SIGKILL what is left after `grace_seconds`;
        returns the pids still alive after that (none, unless a process cannot be killed)."""
        return stop_processes(self.processes, grace_seconds)


def _ray(*args: str, env: dict) -> int:
    """Run `ray …` in a new session and return that session's id (the process's pid)."""
    process = subprocess.Popen(["ray", *args], env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, ["ray", *args], output)
    return process.pid


def start_local_cluster(temp_dir: str, env: dict, cluster: LocalCluster | None = None) -> LocalCluster:
    """A head raylet and a second raylet on NODE_IP, both with one unit of `engine_node`.
    Pass `cluster` to have it filled in as the raylets start, so a caller can stop what
    started even when the second `ray start` fails."""
    port = free_port()
    cluster = cluster or LocalCluster(address="", node_resource="engine_node")
    cluster.address, cluster.node_resource, cluster.temp_dir = f"{NODE_IP}:{port}", "engine_node", temp_dir
    cluster.sessions.append(_ray(
        "start", "--head", f"--port={port}", f"--node-ip-address={NODE_IP}", "--num-cpus=2",
        "--resources={\"engine_node\": 1}", "--include-dashboard=false", f"--temp-dir={temp_dir}",
        "--disable-usage-stats", env=env))
    cluster.sessions.append(_ray(
        "start", f"--address={cluster.address}", f"--node-ip-address={NODE_IP}", "--num-cpus=1",
        f"--temp-dir={temp_dir}", "--resources={\"engine_node\": 1}", "--disable-usage-stats", env=env))
    return cluster


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    os.environ.update(AUTH_ENV)  # the driver and every process it starts
    env = {**os.environ, **AUTH_ENV}
    cluster = LocalCluster(address="", node_resource="engine_node")
    try:
        # short: Ray's Unix socket paths live under it (pytest's own temporary folders, deeper
        # still under a pytest-xdist worker, run past the 107-byte limit of a socket path)
        start_local_cluster(tempfile.mkdtemp(prefix="gocr-ray", dir="/tmp"), env, cluster)
        ray.init(address=cluster.address, log_to_driver=False)
        deadline = time.monotonic() + 60
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the second raylet did not join the local cluster")
            time.sleep(0.5)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster.temp_dir:
            survivors = cluster.stop()
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)
            assert not survivors, f"processes of the test cluster survived SIGKILL: {describe(survivors)}"


# --- finding and stopping processes ---------------------------------------------------------

def _stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[3])


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie has exited; its parent reaps it


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _uses_path(pid: int, path: str) -> bool:
    """Whether the process has a file open (logs, sockets by name) or its working directory
    under `path`; False where /proc does not tell (another user's process)."""
    prefix = path.rstrip("/") + "/"
    try:
        links = [os.readlink(f"/proc/{pid}/cwd")]
        links += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return any(link == path or link.startswith(prefix) for link in links)


def processes_mentioning(fragment: str) -> list[int]:
    """Pids whose command line contains `fragment` (Ray titles actor processes after their
    class, and Ray's own daemons name their temp dir)."""
    return [pid for pid in _pids() if fragment.encode() in _cmdline(pid)]


def cluster_processes(temp_dir: str, sessions: list[int] = ()) -> list[int]:
    """Live pids that belong to a local cluster: in one of its `ray start` sessions, or naming
    or using its temp dir. Never this process."""
    found = []
    for pid in _pids():
        stat = _stat(pid)
        if pid == os.getpid() or stat is None or stat[0] in ("Z", "X"):
            continue
        if stat[1] in sessions or temp_dir.encode() in _cmdline(pid) or _uses_path(pid, temp_dir):
            found.append(pid)
    return found


def describe(pids: list[int]) -> str:
    return "; ".join(f"{pid} {_cmdline(pid)[:120].replace(bytes(1), b' ').decode(errors='replace').strip()}"
                     for pid in pids)


def stop_processes(find, grace_seconds: float = 10) -> list[int]:
    """SIGTERM what `find()` lists, then SIGKILL what it still lists after `grace_seconds`
    (it is asked again each time: a process may start while others stop); returns the pids
    alive after the SIGKILL's grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + grace_seconds
        signalled: set[int] = set()
        while time.monotonic() < deadline:
            remaining = find()
            if not remaining:
                return []
            for pid in set(remaining) - signalled:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
                signalled.add(pid)
            time.sleep(0.2)
    return [pid for pid in find() if _alive(pid)]


def stop_processes_mentioning(marker: str, grace_seconds: float = 10) -> list[int]:
    """Stop the processes whose command line names `marker` (this one excepted)."""
    return stop_processes(lambda: [pid for pid in processes_mentioning(marker)
                                   if pid != os.getpid() and _alive(pid)], grace_seconds)
