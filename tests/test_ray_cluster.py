"""The test cluster's teardown stops every process the cluster started (daemons, agents,
workers, a detached actor) and nothing else: a real two-raylet cluster of its own, a real
driver, a real bystander process."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest

from ray_cluster import AUTH_ENV, LocalCluster, _alive, describe, start_local_cluster

pytestmark = pytest.mark.timeout(300)

DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote
def pid():
    import os
    return os.getpid()

@ray.remote
class Keeper:  # detached: outlives this driver, as a crashed job's actors do
    def ping(self):
        return "pong"

keeper = Keeper.options(name="keeper", lifetime="detached", resources={"engine_node": 1}).remote()
assert ray.get(keeper.ping.remote()) == "pong"
print(len(set(ray.get([pid.remote() for _ in range(6)]))))
"""


def test_stopping_the_cluster_leaves_none_of_its_processes_and_spares_others():
    env = {**os.environ, **AUTH_ENV}
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="gocr-cluster-", dir="/tmp")  # short: Ray's socket paths live under it
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    cluster = LocalCluster(address="", node_resource="engine_node")
    try:
        start_local_cluster(temp_dir, env, cluster)
        subprocess.run([sys.executable, "-c", DRIVER, cluster.address], env=env, check=True, timeout=180,
                       capture_output=True)
        before = cluster.processes()
        titles = describe(before)
        # GCS, two raylets, their agents, and workers (the detached actor's among them)
        assert "gcs_server" in titles and titles.count("raylet/raylet") == 2 and "ray::Keeper" in titles, titles
        started = time.monotonic()
        survivors = cluster.stop()
        assert survivors == [], describe(survivors)
        assert not [pid for pid in before if _alive(pid)], describe(before)
        assert cluster.processes() == []
        assert time.monotonic() - started < 30
        assert bystander.poll() is None  # not the cluster's: untouched
    finally:
        cluster.stop(grace_seconds=2)
        bystander.kill()
        bystander.wait()
