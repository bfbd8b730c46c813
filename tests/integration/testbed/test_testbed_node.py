"""The test bed's real node: a pod runs a real container (the pause image, compiled here) and reaches the
API server through the `kubernetes` Service's ClusterIP; after stop the host is as before (no process,
bridge, iptables rule or chain, mount, cgroup or changed sysctl of the node's left)."""
from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from handoff_testbed import host_state
from handoff_testbed.apiserver import ApiServer
from handoff_testbed.node import BRIDGE, CGROUP, RUN_DIR, Node

pytestmark = [pytest.mark.node, pytest.mark.apiserver]


def _iptables() -> list[str]:
    return [line for binary in ("iptables-save", "ip6tables-save")
            for line in subprocess.run([binary], capture_output=True, text=True).stdout.splitlines()
            if not line.startswith("#")]


def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", *args], input=stdin, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def _netns() -> set[str]:
    netns = Path("/run/netns")
    return set(os.listdir(netns)) if netns.is_dir() else set()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A work directory with a short path: the kubelet binds Unix sockets under it (pod-resources/<n>), whose paths
    must fit in 108 bytes, and pytest's own tmp_path under xdist (`…/popen-gw1/test_a_pod_runs_and_the_host_i0/`)
    did not."""
    path = Path(tempfile.mkdtemp(prefix="handoff-node-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_pod_runs_and_the_host_is_restored(short_tmp: Path) -> None:
    tmp_path = short_tmp
    before = {"iptables": _iptables(), "sysctls": host_state.read_sysctls(), "mounts": host_state.mountpoints(),
              "netns": _netns()}
    api, node = ApiServer(), Node()
    api.fake_nodes = False
    node.images = []  # the pause image only: this test is about the node, not the project's image
    api.start(tmp_path / "apiserver")
    try:
        assert api.kubeconfig is not None
        node.kubeconfig = api.kubeconfig
        node.start(tmp_path / "node")
        # No image record named by id outlives its tagged image (the CRI plugin never removes them; each kept an
        # old build's layers in the cache).
        rows = [line.split() for line in node.ctr("images", "list").splitlines()[1:]]
        tagged = {row[2] for row in rows if not row[0].startswith("sha256:")}
        assert [row[0] for row in rows if row[0].startswith("sha256:") and row[2] not in tagged] == []
        # The pause container runs; its pod gets an address on the node's bridge.
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
               "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:handoff-testbed",
                                        "imagePullPolicy": "Never"}]}}
        _kubectl(api.kubeconfig, "apply", "-f", "-", stdin=json.dumps(pod))
        _kubectl(api.kubeconfig, "wait", "--for=condition=Ready", "pod/p", "--timeout=120s")
        status = json.loads(_kubectl(api.kubeconfig, "get", "pod", "p", "-o", "json"))["status"]
        assert status["podIP"].startswith("10.88.0.")
        # The ClusterIP of `kubernetes` leads to the API server (kube-proxy's DNAT to the node's relay).
        context = ssl.create_default_context(cafile=str(api.ca_cert))  # its certificate names the ClusterIP
        with urllib.request.urlopen("https://10.96.0.1/version", timeout=10, context=context) as resp:
            assert json.load(resp)["gitVersion"] == api.version
        assert Path(f"/sys/class/net/{BRIDGE}").exists()
    finally:
        node.stop()
        api.stop()
    time.sleep(0.5)
    assert not Path(f"/sys/class/net/{BRIDGE}").exists()
    assert _iptables() == before["iptables"]
    assert host_state.read_sysctls() == before["sysctls"]
    assert [m for m in host_state.mountpoints() if m not in before["mounts"]] == []
    assert _netns() <= before["netns"]  # no dead network-namespace files under /run/netns
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{CGROUP}"))
    assert not RUN_DIR.exists()
    assert not (tmp_path / "node" / "teardown-problems.txt").exists()


def _propagation(point: str) -> str | None:
    """The optional fields ("shared:N", ...) of the mount at `point`, or None where nothing is mounted."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == point:
            return " ".join(fields[6:fields.index("-")])
    return None


def test_the_kubelet_root_is_made_a_shared_mount_before_the_kubelet_would(tmp_path: Path) -> None:
    """The kubelet skips its own bind mount of a root that is already shared (MakeRShared), so its
    podresources socket is never renamed across a mount landing under it."""
    root = tmp_path / "kubelet"
    root.mkdir()
    try:
        host_state.make_rshared(root)
        host_state.make_rshared(root)  # idempotent: no second mount stacked
        assert host_state.mounts_under(root) == [str(root)]
        assert "shared:" in (_propagation(str(root)) or "")
    finally:
        for point in host_state.mounts_under(root):
            host_state.unmount(point)
    assert _propagation(str(root)) is None
