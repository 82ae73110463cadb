"""One local multi-node Ray cluster for the whole test session: a head raylet plus a second
raylet on the same host with a custom resource, started with `ray start` and stopped at
the end. Token auth is set the same way on every `ray start` and in the driver."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

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


def _ray(*args: str, env: dict) -> None:
    subprocess.run(["ray", *args], check=True, env=env, timeout=120, capture_output=True)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    import ray

    os.environ.update(AUTH_ENV)  # the driver and every process it starts
    env = {**os.environ, **AUTH_ENV}
    port = free_port()
    address = f"{NODE_IP}:{port}"
    temp_dir = str(tmp_path_factory.mktemp("ray"))
    try:
        _ray("start", "--head", f"--port={port}", f"--node-ip-address={NODE_IP}", "--num-cpus=2",
             "--resources={\"engine_node\": 1}", "--include-dashboard=false", f"--temp-dir={temp_dir}",
             "--disable-usage-stats", env=env)
        _ray("start", f"--address={address}", f"--node-ip-address={NODE_IP}", "--num-cpus=1", f"--temp-dir={temp_dir}",
             "--resources={\"engine_node\": 1}", "--disable-usage-stats", env=env)
        ray.init(address=address, log_to_driver=False)
        deadline = time.monotonic() + 60
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the second raylet did not join the local cluster")
            time.sleep(0.5)
        yield LocalCluster(address=address, node_resource="engine_node")
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stop_processes_mentioning(temp_dir)


def processes_mentioning(fragment: str) -> list[int]:
    """Pids whose command line contains `fragment` (Ray titles actor processes after their
    class, and every process of a cluster names its temp dir)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if fragment.encode() in handle.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def stop_processes_mentioning(marker: str, grace_seconds: float = 10) -> None:
    """Stop this cluster's processes only (each names its temp dir on its command line);
    `ray stop` would also end any other Ray running on the machine."""
    def matching() -> list[int]:
        return [pid for pid in processes_mentioning(marker) if pid != os.getpid()]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in matching():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_seconds
        while matching() and time.monotonic() < deadline:
            time.sleep(0.2)
