"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and kwok standing in for the kubelets.

Modelled on controller-runtime's envtest, but with the controllers added, because the operator relies
on behaviour that lives there, not in the apiserver: garbage collection of children through
ownerReferences, Deployment → ReplicaSet → Pod, the default ServiceAccount in each namespace. kwok
fakes one Node and walks every Pod scheduled to it through Running/Ready without starting containers,
so Deployments become Available; nothing actually runs in a pod. Set HANDOFF_TESTBED_NODES=0 for a
node-less cluster where Pods stay Pending.

Authorization is real RBAC, so the operator's Role/RoleBinding manifests can be tested for what they
actually allow. Clients authenticate with static bearer tokens: `admin` (system:masters) is what the
kubeconfig carries; each control-plane component has its own token so its requests are told apart.
"""
from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path

from .base import Component, StartupClock
from .k8s_build import ControlPlaneBinaries, build_control_plane, build_kubectl, kubernetes_version
from .k8s_pki import Pki, TokenUser, write_kubeconfig, write_pki, write_token_file
from .proc import Service, free_port, wait_until

SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
FAKE_NODE = "kwok-node-0"
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


def nodes_enabled() -> bool:
    return os.environ.get("HANDOFF_TESTBED_NODES", "1") != "0"


class ApiServer(Component):
    """`.kubeconfig` (Path), `.server` (https URL), `.token` (admin bearer token), `.ca_cert` (Path),
    `.nodes` (names of the fake nodes; empty when started without them)."""

    name = "apiserver"

    def __init__(self) -> None:
        super().__init__()
        self.bins: ControlPlaneBinaries | None = None
        self.etcd: Service | None = None
        self.kube_apiserver: Service | None = None
        self.controller_manager: Service | None = None
        self.scheduler: Service | None = None
        self.kwok: Service | None = None
        self.nodes: list[str] = []
        self.kubeconfig: Path | None = None
        self.server: str = ""
        self.token: str = ""
        self.ca_cert: Path | None = None
        self.version = kubernetes_version()
        # None: HANDOFF_TESTBED_NODES decides; False: no kwok node (a real `node` joins instead).
        self.fake_nodes: bool | None = None
        self.startup_seconds: float | None = None
        # Seconds from start() until each stage was ready, for bench/ (not for test assertions).
        self.startup_marks: dict[str, float] = {}

    def build(self) -> None:
        self.bins = build_control_plane()
        # The client the tests and `hack/testbed up apiserver`'s shell use (toolchains puts it on PATH).
        build_kubectl()

    # -- start -------------------------------------------------------------------------------

    def _start(self, workdir: Path) -> dict[str, str]:
        clock = StartupClock(self.startup_marks)
        mark = clock.mark
        if self.bins is None:
            self.build()
        assert self.bins is not None
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        pki = write_pki(workdir / "pki", SERVICE_IP)
        self.ca_cert = pki.ca_cert
        admin = TokenUser.new("admin", "system:masters")
        kcm_user = TokenUser.new("system:kube-controller-manager", "system:masters")
        scheduler_user = TokenUser.new("system:kube-scheduler", "system:masters")
        kwok_user = TokenUser.new("kwok", "system:masters")
        write_token_file(workdir / "tokens.csv", [admin, kcm_user, scheduler_user, kwok_user])
        self.token = admin.token
        mark("pki")
        etcd_url = self._start_etcd(workdir)
        mark("etcd")
        self._start_apiserver(workdir, pki, etcd_url)
        mark("kube-apiserver")
        self.kubeconfig = workdir / "kubeconfig"
        write_kubeconfig(self.kubeconfig, self.server, pki.ca_cert, admin)
        self._start_controller_manager(workdir, pki, kcm_user)
        mark("kube-controller-manager")
        if self.fake_nodes is False:
            self._start_scheduler(workdir, pki, scheduler_user)
        elif nodes_enabled():
            self._start_scheduler(workdir, pki, scheduler_user)
            self._start_kwok(workdir, pki, kwok_user)
            mark("kwok-node")
        self.startup_seconds = clock.elapsed()
        return {"KUBECONFIG": str(self.kubeconfig)}

    def _start_etcd(self, workdir: Path) -> str:
        assert self.bins is not None
        client_port, peer_port = free_port(), free_port()
        client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        self.etcd = Service("etcd", [
            str(self.bins.etcd), "--name=testbed", f"--data-dir={workdir / 'etcd-data'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=testbed={peer}", "--initial-cluster-state=new",
            # A throwaway store: skipping fsync makes it several times faster on a busy disk.
            "--unsafe-no-fsync=true", "--log-level=warn",
        ], workdir / "etcd.log").start()

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                return bool(json.load(resp).get("health") == "true")

        wait_until(healthy, 30, "etcd", self.etcd)
        return client

    def _start_apiserver(self, workdir: Path, pki: Pki, etcd_url: str) -> None:
        assert self.bins is not None
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self.kube_apiserver = Service("kube-apiserver", [
            str(self.bins.kube_apiserver), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--token-auth-file={workdir / 'tokens.csv'}", "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-issuer={SA_ISSUER}", f"--service-account-key-file={pki.sa_public_key}",
            f"--service-account-signing-key-file={pki.sa_private_key}",
            # The `kubernetes` Service cannot point at a loopback address (Endpoints validation), and
            # no pod runs here to use it: skip its endpoint reconciler instead of logging errors.
            "--endpoint-reconciler-type=none",
            # Logs/exec/port-forward go to a node's InternalIP (the real node's hostname resolves nowhere).
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--allow-privileged=true", "--profiling=false", "--v=1",
        ], workdir / "kube-apiserver.log").start()
        wait_until(lambda: self._get("/readyz") == 200, 60, "kube-apiserver /readyz", self.kube_apiserver, 0.2)

    def _start_controller_manager(self, workdir: Path, pki: Pki, user: TokenUser) -> None:
        assert self.bins is not None
        kubeconfig = workdir / "kube-controller-manager.kubeconfig"
        write_kubeconfig(kubeconfig, self.server, pki.ca_cert, user)
        port = free_port()
        self.controller_manager = Service("kube-controller-manager", [
            str(self.bins.kube_controller_manager), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", f"--cert-dir={workdir / 'kcm-certs'}",
            "--leader-elect=false", "--use-service-account-credentials=false",
            f"--service-account-private-key-file={pki.sa_private_key}", f"--root-ca-file={pki.ca_cert}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--controllers=*", "--profiling=false", "--v=1",
            # Room for a late node heartbeat when the 2 CPUs are saturated (a bulk apply of 1,000 handoffs): a
            # node declared NotReady gets its pods marked unready and tainted for eviction, and every such pod
            # change reconciles a handoff. No test relies on noticing a dead node within the default 50 s.
            "--node-monitor-grace-period=2m",
        ], workdir / "kube-controller-manager.log").start()
        # Ready means the controllers run, not just that the port answers: the serviceaccount
        # controller has created `default/default`, without which Pods cannot be admitted.
        wait_until(lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200,
                   60, "kube-controller-manager (default ServiceAccount)", self.controller_manager, 0.2)

    def _start_scheduler(self, workdir: Path, pki: Pki, user: TokenUser) -> None:
        assert self.bins is not None
        kubeconfig = workdir / "kube-scheduler.kubeconfig"
        write_kubeconfig(kubeconfig, self.server, pki.ca_cert, user)
        self.scheduler = Service("kube-scheduler", [
            str(self.bins.kube_scheduler), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
            "--profiling=false", "--v=1",
        ], workdir / "kube-scheduler.log").start()

    def _start_kwok(self, workdir: Path, pki: Pki, user: TokenUser) -> None:
        """kwok with its built-in fast stages: nodes go Ready, pods bound to them go Running at once."""
        assert self.bins is not None
        kubeconfig = workdir / "kwok.kubeconfig"
        write_kubeconfig(kubeconfig, self.server, pki.ca_cert, user)
        key, value = KWOK_ANNOTATION
        self.kwok = Service("kwok", [
            str(self.bins.kwok), f"--kubeconfig={kubeconfig}",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--cidr=10.244.0.1/16", "--node-ip=127.0.0.1",
            # Heartbeats by node Lease, as kubelets do. Without it kwok only patches a node's status every ~5 min,
            # so the node lifecycle controller declared its nodes NotReady between those patches (pods marked
            # unready, NoExecute taints, evictions: the flapping that kept operator benchmarks from settling).
            "--node-lease-duration-seconds=40",
        ], workdir / "kwok.log", env={"HOME": str(workdir)}).start()  # HOME: ignore a user's ~/.kwok
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": FAKE_NODE, "annotations": {key: value},
                         "labels": {"kubernetes.io/hostname": FAKE_NODE, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "type": "kwok"}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"},
                       "capacity": {"cpu": "64", "memory": "256Gi", "pods": "250"}},
        }
        status, _ = self._request("POST", "/api/v1/nodes", node)
        if status not in (201, 409):
            raise RuntimeError(f"creating fake node {FAKE_NODE}: HTTP {status}")
        self.nodes = [FAKE_NODE]

        def node_ready() -> bool:
            code, body = self._request("GET", f"/api/v1/nodes/{FAKE_NODE}")
            conditions = body.get("status", {}).get("conditions", []) if code == 200 else []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_until(node_ready, 60, "kwok (fake node Ready)", self.kwok, 0.2)
        if self.scheduler is not None and not self.scheduler.alive():
            raise RuntimeError(f"kube-scheduler exited:\n{self.scheduler.log_tail()}")

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """One authenticated API call with the admin token (no client library in the test bed)."""
        assert self.ca_cert is not None
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as resp:
                payload = resp.read()
                is_json = resp.headers.get_content_type() == "application/json"
                return int(resp.status), json.loads(payload) if is_json else {}
        except urllib.error.HTTPError as err:
            return int(err.code), {}

    def _get(self, path: str) -> int:
        return self._request("GET", path)[0]

    # -- stop --------------------------------------------------------------------------------

    def _services(self) -> list[Service]:
        """In stop order: clients of the apiserver first, the store last."""
        order = (self.kwok, self.scheduler, self.controller_manager, self.kube_apiserver, self.etcd)
        return [s for s in order if s is not None]

    def stop(self) -> None:
        for service in self._services():
            service.stop()

    def pids(self) -> list[int]:
        return [s.pid for s in self._services() if s.pid is not None]
