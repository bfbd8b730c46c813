"""A real Kubernetes node on this machine: containerd + runc + CNI + kubelet + kube-proxy, registered
to the test-bed kube-apiserver, so pods run real containers (the operator, Spark drivers, executors).

kwok stays for tests that only need pods to exist; this is for tests where a container must run.
What it takes on these machines (see shared/research/real-pods.md): Debian's containerd, runc and CNI
plugins; the kubelet and kube-proxy built from the Kubernetes module (k8s_build.build_node); a pause
image compiled from Kubernetes' source (pause_image); two settings for this VM, containerd's
`restrict_oom_score_adj` (no CAP_SYS_RESOURCE here) and the kubelet's `failCgroupV1: false`.

Network: one bridge (`handoff0`, 10.88.0.1/24) made by the test bed, pods on it through CNI's bridge,
portmap and firewall plugins. Pods reach the host only at the bridge's gateway address: there the node
relays to the apiserver's loopback port (tcp_forward) and points the `kubernetes` Service at the relay;
kube-proxy (a host process, iptables mode) makes the Service's ClusterIP work. There is no cluster DNS:
in-cluster clients use the KUBERNETES_SERVICE_HOST address, Spark its `driver.master` set to it.

Host side effects (sysctls, iptables, mounts, the bridge, cgroups, /var/log/containers) are recorded
before start and undone on stop by host_state, also from `hack/testbed down` (`teardown(workdir)`).
Only one node can run on a machine at a time (they would share iptables chains and the bridge).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import host_state
from .base import Component, StartupClock
from .k8s_build import NodeBinaries, build_node
from .pause_image import REF as PAUSE_REF, build_pause_image
from .paths import cache_dir
from .proc import Service, StartupError, free_port, stop_pid, wait_until
from .tcp_forward import start_relay

NODE_NAME = "handoff-node"
BRIDGE = "handoff0"
POD_SUBNET = "10.88.0.0/24"
GATEWAY = "10.88.0.1"
RUN_DIR = Path("/run/handoff-node")  # short: containerd's socket path must fit a sockaddr_un
CGROUP = "handoff-node"
OWNER_FILE = Path("/run/handoff-node.owner")
CNI_BIN_DIR = Path("/usr/lib/cni")
CONTAINER_LOGS = Path("/var/log/containers")
WAIT_FOR_OTHER_NODE = 900.0
#: The kubelet's hard eviction threshold on the node's and the images' file systems (`evictionHard` below).
EVICTION_FREE_FRACTION = 0.01
#: Room the node's tests need above that threshold once the images are in: pod logs, containers' layers, Spark's
#: scratch space. While two whole suites' tests ran, the disk's free space fell by at most 1.3 GiB (sampled every
#: 5 s, 2026-12-07; the image's build before them took 2.6 GiB for a moment, before any node starts), so 2 GiB
#: leaves room above what the node's tests take.
NODE_WORKING_SPACE = 2 * 1024**3


def disk_shortfall(where: str, free: int, total: int, working: int = NODE_WORKING_SPACE) -> str | None:
    """Why the node cannot start on a file system with `free` of `total` bytes, or None.

    Why check: below the kubelet's eviction threshold it admits no pod ("eviction thresholds have been met, but no
    pods are active to evict") and garbage-collects images, the pause image among them, so every node test fails
    minutes later with nothing in its output about the disk (twice in this project's suite runs)."""
    need = int(total * EVICTION_FREE_FRACTION) + working
    if free >= need:
        return None
    gib = 1024**3
    return (f"the test-bed node needs {need / gib:.1f} GiB free on the file system of {where} (the kubelet evicts "
            f"every pod below {EVICTION_FREE_FRACTION:.0%} of its {total / gib:.0f} GiB, and its tests need "
            f"{working / gib:.0f} GiB above that): {free / gib:.1f} GiB free. Free some, e.g. `.venv/bin/uv cache "
            f"prune`, old clones' .test-logs/, {cache_dir()}/fresh-machine")


def stale_images(listing: list[tuple[str, str]], wanted: set[str]) -> list[str]:
    """Of containerd's images (`(ref, manifest digest)`), the ones to remove: earlier builds of the project's image
    and every id-named record (`sha256:…`) that is not the same image as a kept one.

    Why the id-named ones: containerd's CRI plugin adds one per imported image and never removes it, so removing an
    old build's tag alone kept its layers: 8.7 GB of old builds in one machine's cache, which with the disk check
    below stopped a CI run."""
    kept = {digest for ref, digest in listing
            if ref in wanted or not (":dev-" in ref or ref.startswith("sha256:"))}
    return [ref for ref, digest in listing
            if ref not in wanted and digest not in kept and (":dev-" in ref or ref.startswith("sha256:"))]


def check_disk(workdir: Path) -> None:
    """StartupError (`disk_shortfall`'s line) unless the kubelet's work directory (its nodefs) and containerd's
    image store in the cache (its imagefs) have room."""
    images = cache_dir() / "node"
    images.mkdir(parents=True, exist_ok=True)
    for where in (workdir, images):
        usage = shutil.disk_usage(where)
        problem = disk_shortfall(str(where), usage.free, usage.total)
        if problem:
            raise StartupError(problem)


def _kubeconfig_server(kubeconfig: Path) -> str:
    match = re.search(r"^\s*server:\s*(\S+)", kubeconfig.read_text(), re.MULTILINE)
    if not match:
        raise StartupError(f"no server in {kubeconfig}")
    return match.group(1)


def _free_port_on(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Node(Component):
    """`.kubeconfig` (the apiserver to register with; default $KUBECONFIG, which `hack/testbed up
    apiserver node` has set), `.images` (docker-save tarballs to import; default: the project's image),
    `.node_name`, `.gateway` (the host's address as pods see it)."""

    name = "node"

    def __init__(self) -> None:
        super().__init__()
        self.kubeconfig: Path | None = None
        self.images: list[Path] | None = None
        self.bins: NodeBinaries | None = None
        self.pause_tarball: Path | None = None
        self.node_name = NODE_NAME
        self.gateway = GATEWAY
        self.containerd: Service | None = None
        self.kubelet: Service | None = None
        self.kube_proxy: Service | None = None
        self.relay: Service | None = None
        self.startup_marks: dict[str, float] = {}

    # -- build -------------------------------------------------------------------------------

    def build(self) -> None:
        for tool in ("containerd", "runc", "ctr", "iptables"):
            if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
                raise RuntimeError(f"the node needs {tool}: apt-get install docker.io containernetworking-plugins"
                                   " (hack/install-system-deps.sh)")
        if not (CNI_BIN_DIR / "bridge").exists():
            raise RuntimeError("the node needs the CNI plugins: apt-get install containernetworking-plugins")
        self.bins = build_node()
        self.pause_tarball = build_pause_image()
        if self.images is None:
            from .image import build_image
            self.images = [build_image().tarball]

    @property
    def socket(self) -> Path:
        return RUN_DIR / "containerd.sock"

    def ctr(self, *args: str, stdin: int | None = None, check: bool = True) -> str:
        result = subprocess.run(["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
                                stdin=stdin, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def load_image(self, tarball: Path) -> list[str]:
        """Import a `docker save` tarball unless every image it names is already in containerd (the
        store persists in the cache). Returns the image references, as containerd names them."""
        import tarfile
        with tarfile.open(tarball) as tar:
            member = tar.extractfile("manifest.json")
            tags = [tag for entry in json.load(member) for tag in entry.get("RepoTags", [])] if member else []
        refs = [self._normalize(tag) for tag in tags]
        present = set(self.ctr("images", "list", "--quiet").split())
        if not refs or not all(ref in present for ref in refs):
            with open(tarball, "rb") as stream:
                self.ctr("images", "import", "-", stdin=stream.fileno())
        return refs

    def _prune_images(self, wanted: set[str], keep_every_tag: bool) -> None:
        """Drop earlier builds of the project's image (`…:dev-<hash>`, each source change adds one; all kept with
        `keep_every_tag`) and the records the CRI plugin names by image id (`sha256:…`) of images no longer kept, and
        wait for containerd to collect their layers."""
        rows = [line.split() for line in self.ctr("images", "list").splitlines()[1:]]
        listing = [(row[0], row[2]) for row in rows if len(row) > 2]
        if keep_every_tag:
            wanted = wanted | {ref for ref, _ in listing if not ref.startswith("sha256:")}
        old = stale_images(listing, wanted)
        if old:
            self.ctr("images", "remove", "--sync", *old, check=False)

    @staticmethod
    def _normalize(ref: str) -> str:
        """`handoff:x` → `docker.io/library/handoff:x`, as containerd names imported images."""
        first = ref.split("/")[0]
        if "/" not in ref:
            return f"docker.io/library/{ref}"
        if "." not in first and ":" not in first and first != "localhost":
            return f"docker.io/{ref}"
        return ref

    # -- start -------------------------------------------------------------------------------

    def _start(self, workdir: Path) -> dict[str, str]:
        mark = StartupClock(self.startup_marks).mark
        if self.bins is None:
            self.build()
        assert self.bins is not None and self.pause_tarball is not None
        kubeconfig = self.kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
        if kubeconfig is None or not kubeconfig.exists():
            raise StartupError("the node registers with the test-bed apiserver: start `apiserver` first"
                               " (hack/testbed up apiserver node) or set Node.kubeconfig")
        self.kubeconfig = kubeconfig
        self.workdir = workdir.resolve()
        workdir = self.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self._claim_machine(workdir)
        host_state.snapshot(workdir / "host-state.json", {
            "container_logs_existed": CONTAINER_LOGS.exists(),
            "cni_state_existed": Path("/var/lib/cni").exists(),
        })
        (workdir / "node.json").write_text(json.dumps({"pod_logs": str(workdir / "pod-logs")}))
        mark("snapshot")
        self._make_bridge()
        host_state.make_cgroup(CGROUP)
        self._start_containerd(workdir)
        assert self.containerd is not None
        # The owner is whoever keeps the node alive: containerd (the `testbed up` process exits).
        OWNER_FILE.write_text(json.dumps({"pid": self.containerd.pid, "workdir": str(workdir)}))
        mark("containerd")
        self._cleanup_leftover_containers()
        wanted = {PAUSE_REF} | {tag for tarball in [self.pause_tarball, *(self.images or [])]
                                for tag in self.load_image(tarball)}
        self._prune_images(wanted, keep_every_tag=not self.images)  # a node for the pause image alone keeps builds
        mark("images")
        check_disk(workdir)  # once old builds are gone: they are what fills a CI machine's disk
        relay_port = self._start_relay(workdir)
        self._point_kubernetes_service(relay_port)
        self._start_kube_proxy(workdir)
        self._start_kubelet(workdir)
        wait_until(self._node_ready, 120, "kubelet (node Ready)", self.kubelet, 0.5)
        mark("node Ready")
        return {"HANDOFF_NODE": self.node_name, "HANDOFF_NODE_GATEWAY": self.gateway,
                "HANDOFF_NODE_CONTAINERD": str(self.socket)}

    def _claim_machine(self, workdir: Path) -> None:
        """One node per machine: wait for another session's node to stop; clean up after a dead one."""
        deadline = time.monotonic() + WAIT_FOR_OTHER_NODE
        while OWNER_FILE.exists():
            try:
                owner = json.loads(OWNER_FILE.read_text())
            except (OSError, ValueError):
                break
            alive = owner.get("pid") and Path(f"/proc/{owner['pid']}").exists()
            if not alive:
                teardown(Path(owner.get("workdir", "")))
                break
            if time.monotonic() > deadline:
                raise StartupError(f"another test-bed node is running (pid {owner['pid']}, {owner.get('workdir')});"
                                   " stop it with `hack/testbed down`")
            time.sleep(2)
        OWNER_FILE.write_text(json.dumps({"pid": os.getpid(), "workdir": str(workdir)}))

    def _make_bridge(self) -> None:
        """The bridge with its gateway address, before any pod: the relay binds to the gateway."""
        if not Path(f"/sys/class/net/{BRIDGE}").exists():
            subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "replace", f"{GATEWAY}/24", "dev", BRIDGE], check=True)
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)

    def _start_containerd(self, workdir: Path) -> None:
        root = cache_dir() / "node" / "containerd"  # images persist: the 1 GB import happens once
        root.mkdir(parents=True, exist_ok=True)
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        cni_conf = workdir / "cni"
        cni_conf.mkdir(exist_ok=True)
        (cni_conf / "10-handoff.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "handoff-node",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(workdir / "cni-ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
                # Accepts the pods' traffic in FORWARD even where a Docker daemon set its policy to DROP.
                {"type": "firewall", "backend": "iptables"},
            ],
        }, indent=1))
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        config = workdir / "containerd.toml"
        config.write_text(f"""version = 2
root = "{root}"
state = "{RUN_DIR / 'state'}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
{cri}]
  sandbox_image = "{PAUSE_REF}"
  # No CAP_SYS_RESOURCE in this VM's bounding set: the pause container's oom_score_adj -998 fails.
  restrict_oom_score_adj = true
  tolerate_missing_hugetlb_controller = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  {cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    {cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      {cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{RUN_DIR / 'runc'}"
  {cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
""")
        self.containerd = Service("containerd", ["containerd", "--config", str(config)],
                                  workdir / "containerd.log").start()
        wait_until(lambda: subprocess.run(["ctr", "--address", str(self.socket), "version"],
                                          capture_output=True).returncode == 0,
                   30, "containerd", self.containerd, 0.1)

    def _cleanup_leftover_containers(self) -> None:
        """A killed run can leave containers in the persistent root; the kubelet must start clean."""
        _remove_containers(self.socket)

    def _start_relay(self, workdir: Path) -> int:
        assert self.kubeconfig is not None
        target = _kubeconfig_server(self.kubeconfig).removeprefix("https://")
        self.relay, port = start_relay(GATEWAY, target, workdir / "apiserver-relay.log")
        return port

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(["kubectl", f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise StartupError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def _point_kubernetes_service(self, relay_port: int) -> None:
        """The apiserver runs without its endpoint reconciler (it listens on loopback, which Endpoints
        may not name): publish the relay as the `kubernetes` Service's endpoint instead."""
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "kubernetes"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": relay_port, "protocol": "TCP"}],
        }
        self._kubectl("apply", "-f", "-", stdin=json.dumps(slice_))

    def _start_kube_proxy(self, workdir: Path) -> None:
        assert self.bins is not None and self.kubeconfig is not None
        config = workdir / "kube-proxy.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "hostnameOverride": self.node_name, "bindAddress": GATEWAY, "clusterCIDR": POD_SUBNET,
            "healthzBindAddress": f"127.0.0.1:{free_port()}", "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "nodePortAddresses": [f"{GATEWAY}/32"],
            # Leave the host's conntrack sysctls and route_localnet alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        }))
        self.kube_proxy = Service("kube-proxy", [str(self.bins.kube_proxy), f"--config={config}", "--v=1"],
                                  workdir / "kube-proxy.log").start()

    def _start_kubelet(self, workdir: Path) -> None:
        assert self.bins is not None and self.kubeconfig is not None
        root = workdir / "kubelet"
        root.mkdir(exist_ok=True)
        host_state.make_rshared(root)  # before the kubelet: see make_rshared; undone by teardown's restore
        config = workdir / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": GATEWAY, "port": _free_port_on(GATEWAY), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{CGROUP}", "failCgroupV1": False,
            "failSwapOn": False, "podLogsDir": str(workdir / "pod-logs"),
            "volumePluginDir": str(workdir / "volume-plugins"),
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "maxPods": 30,
            "resolvConf": "/etc/resolv.conf",
            "nodeStatusUpdateFrequency": "2s",
            "shutdownGracePeriod": "0s",
        }))
        self.kubelet = Service("kubelet", [
            str(self.bins.kubelet), f"--config={config}", f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={root}", f"--hostname-override={self.node_name}", f"--node-ip={GATEWAY}", "--v=1",
        ], workdir / "kubelet.log").start()

    def _node_ready(self) -> bool:
        out = self._kubectl("get", "node", self.node_name, "-o", "json")
        conditions = json.loads(out).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # -- stop --------------------------------------------------------------------------------

    def _services(self) -> list[Service]:
        order = (self.kubelet, self.kube_proxy, self.relay, self.containerd)
        return [s for s in order if s is not None]

    def stop(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.containerd is not None and self.containerd.alive():
            _remove_containers(self.socket)
        for service in self._services():
            service.stop()
        self.kubelet = self.kube_proxy = self.relay = self.containerd = None
        if self.workdir is not None:
            problems = teardown(self.workdir)
            if problems:
                (self.workdir / "teardown-problems.txt").write_text("\n".join(problems) + "\n")

    def pids(self) -> list[int]:
        return [s.pid for s in self._services() if s.pid is not None]

    def teardown(self, workdir: Path) -> None:
        teardown(workdir)


def _remove_containers(sock: Path) -> None:
    """Kill and delete every container in containerd's k8s.io namespace (their shims exit with them)."""
    def ctr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str(sock), "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=60)

    with contextlib.suppress(Exception):
        for task in ctr("tasks", "list", "--quiet").stdout.split():
            ctr("tasks", "kill", "--signal", "SIGKILL", task)
        time.sleep(0.5)
        for task in ctr("tasks", "list", "--quiet").stdout.split():
            ctr("tasks", "delete", "--force", task)
        containers = ctr("containers", "list", "--quiet").stdout.split()
        if containers:
            ctr("containers", "delete", *containers)


def _our_processes() -> list[int]:
    """containerd shims (own sessions, so not in containerd's process group) and relays listening on the
    bridge: found by their command lines (RUN_DIR; tcp_forward from the gateway address)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        relay = "handoff_testbed.tcp_forward" in cmdline and f" {GATEWAY}:" in cmdline
        if (str(RUN_DIR) in cmdline or relay) and int(proc.name) != os.getpid():
            pids.append(int(proc.name))
    return pids


def _cgroup_processes() -> list[int]:
    """Container processes left in the node's cgroups (a container outlives a killed shim)."""
    pids: set[int] = set()
    for procs in host_state.CGROUP_ROOT.glob(f"*/{CGROUP}/**/cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(line) for line in procs.read_text().split())
    return sorted(pids)


def _unix_socket_answers(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(str(path)) == 0


def teardown(workdir: Path) -> list[str]:
    """Put the host back as `workdir/host-state.json` found it, after the node's processes stopped
    (Node.stop, or `hack/testbed down` after killing the recorded pids). Idempotent."""
    problems: list[str] = []
    if _unix_socket_answers(RUN_DIR / "containerd.sock"):
        _remove_containers(RUN_DIR / "containerd.sock")
    for pid in _our_processes() + _cgroup_processes():
        stop_pid(pid, timeout=5, sig=signal.SIGKILL)
    state_file = workdir / "host-state.json"
    if state_file.exists():
        state = json.loads(state_file.read_text())
        pod_logs = json.loads((workdir / "node.json").read_text())["pod_logs"] if (
            workdir / "node.json").exists() else None
        if CONTAINER_LOGS.is_dir() and pod_logs:
            for link in CONTAINER_LOGS.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(pod_logs):
                    link.unlink()
            if not state.get("container_logs_existed"):
                with contextlib.suppress(OSError):
                    CONTAINER_LOGS.rmdir()
        problems += host_state.restore(state_file, [workdir, RUN_DIR, cache_dir() / "node"], [BRIDGE], [CGROUP])
        if not state.get("cni_state_existed"):
            shutil.rmtree("/var/lib/cni", ignore_errors=True)
        else:
            for cached in Path("/var/lib/cni/results").glob("handoff-node-*"):
                cached.unlink(missing_ok=True)
        state_file.rename(workdir / "host-state.restored.json")
    else:
        host_state.remove_cgroup_tree(CGROUP)
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
    for point in host_state.mounts_under(RUN_DIR):
        host_state.unmount(point)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(OWNER_FILE.read_text()).get("workdir") == str(workdir):
            OWNER_FILE.unlink()
    return problems
