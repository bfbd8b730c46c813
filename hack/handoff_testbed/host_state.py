"""Host state a real node changes, recorded before it starts and put back after it stops.

A kubelet, containerd, CNI and kube-proxy change the machine, not just their own directories: host
sysctls (kernel.panic, vm.overcommit_memory, net.ipv4.ip_forward ...), iptables chains and rules, a
bridge, network-namespace and volume mounts, cgroups. The test bed must leave the machine as it found
it, also after `hack/testbed up` whose process is long gone by `down`, so the snapshot is plain JSON
written next to the node's state, and `restore()` needs nothing but that file.

The rules: undo only what appeared after the snapshot (rules, chains, nft tables, mounts under the
node's own paths) and put back only the values the node itself is known to set, never a blanket
"restore everything", which would undo what someone else on the machine did meanwhile.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

# Sysctls the kubelet, kube-proxy and CNI's bridge plugin set (with ipMasq/isGateway).
SYSCTLS = (
    "kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory", "vm.panic_on_oom",
    "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward", "net.ipv4.conf.all.forwarding", "net.ipv4.conf.default.forwarding",
    "net.ipv4.conf.all.route_localnet", "net.ipv6.conf.all.forwarding",
    "net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max", "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait", "net.netfilter.nf_conntrack_tcp_be_liberal",
)
IPTABLES = ("iptables", "ip6tables")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    values = {}
    for key in SYSCTLS:
        with contextlib.suppress(OSError):
            values[key] = _sysctl_path(key).read_text().strip()
    return values


def _iptables_save(binary: str) -> list[str]:
    save = shutil.which(f"{binary}-save")
    if save is None:
        return []
    result = subprocess.run([save], capture_output=True, text=True)
    return result.stdout.splitlines() if result.returncode == 0 else []


def _nft_tables() -> list[str]:
    if shutil.which("nft") is None:
        return []
    result = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    return [line.strip() for line in result.stdout.splitlines() if line.startswith("table ")]


def mountpoints() -> list[str]:
    """Mount points in mount order (from /proc/self/mountinfo; octal escapes decoded)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        points.append(raw.encode().decode("unicode_escape"))
    return points


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path`, deepest (last mounted) first, so they unmount cleanly."""
    prefix = str(path).rstrip("/")
    return [p for p in reversed(mountpoints()) if p == prefix or p.startswith(prefix + "/")]


def make_rshared(path: Path) -> None:
    """Make `path` a mount point with shared propagation, as the kubelet's `MakeRShared` would
    (`mount --bind path path; mount --make-rshared path`); a no-op where it already is one. Doing it
    before the kubelet starts keeps the kubelet from bind-mounting its root while its podresources
    goroutine renames a socket into it: a rename whose two path lookups straddle that mount fails with
    EXDEV, and the kubelet exits ("invalid cross-device link", seen once in CI)."""
    target = str(path.resolve())
    if target not in mountpoints():
        subprocess.run(["mount", "--bind", target, target], check=True, capture_output=True)
    subprocess.run(["mount", "--make-rshared", target], check=True, capture_output=True)


def unmount(target: str) -> None:
    if subprocess.run(["umount", target], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", target], capture_output=True)


def remove_cgroup_tree(name: str) -> list[str]:
    """rmdir `/<name>` and everything below it in every cgroup hierarchy, deepest first (cgroupfs
    directories cannot be removed with rm -r). Returns what could not be removed (still has tasks)."""
    left = []
    if not CGROUP_ROOT.is_dir():
        return left
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / name.strip("/")
        if not top.is_dir():
            continue
        for dirpath, _, _ in sorted(os.walk(top), key=lambda entry: -entry[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                left.append(dirpath)
    return left


def make_cgroup(name: str) -> None:
    """Create `/<name>` in every cgroup v1 hierarchy (the kubelet insists its cgroupRoot exists)."""
    if not CGROUP_ROOT.is_dir():
        return
    for hierarchy in CGROUP_ROOT.iterdir():
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            with contextlib.suppress(OSError):
                (hierarchy / name.strip("/")).mkdir(exist_ok=True)


def snapshot(path: Path, extra: dict[str, object] | None = None) -> None:
    """Record the host state `restore` compares against."""
    state = {
        "sysctls": read_sysctls(),
        "iptables": {binary: _iptables_save(binary) for binary in IPTABLES},
        "nft_tables": _nft_tables(),
        "mounts": mountpoints(),
        **(extra or {}),
    }
    path.write_text(json.dumps(state, indent=1))


def _undo_iptables(binary: str, before: list[str]) -> list[str]:
    """Delete rules and chains that are not in `before`; put back changed chain policies."""
    problems: list[str] = []
    table = ""
    known_rules = set(before)
    before_chains: dict[str, dict[str, str]] = {}
    for line in before:
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            chain, policy = line[1:].split()[:2]
            before_chains.setdefault(table, {})[chain] = policy
    table = ""
    new_chains: list[tuple[str, str]] = []
    for line in _iptables_save(binary):
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            chain, policy = line[1:].split()[:2]
            old = before_chains.get(table, {})
            if chain not in old:
                new_chains.append((table, chain))
            elif policy != "-" and old[chain] != policy:
                subprocess.run([binary, "-t", table, "-P", chain, old[chain]], capture_output=True)
        elif line.startswith("-A ") and line not in known_rules:
            args = shlex.split(line)
            args[0] = "-D"
            result = subprocess.run([binary, "-t", table, *args], capture_output=True, text=True)
            if result.returncode != 0:
                problems.append(f"{binary} -t {table} {' '.join(args)}: {result.stderr.strip()}")
    for table, chain in new_chains:
        subprocess.run([binary, "-t", table, "-F", chain], capture_output=True)
    for table, chain in new_chains:
        result = subprocess.run([binary, "-t", table, "-X", chain], capture_output=True, text=True)
        if result.returncode != 0:
            problems.append(f"{binary} -t {table} -X {chain}: {result.stderr.strip()}")
    return problems


def restore(path: Path, own_paths: list[Path], links: list[str], cgroups: list[str]) -> list[str]:
    """Undo what appeared since `snapshot(path)`: mounts under `own_paths` and netns mounts, the
    network `links`, iptables rules/chains and nft tables, the `cgroups` trees, and the sysctls.
    Returns problems (empty when the host is back as it was)."""
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    problems: list[str] = []
    old_mounts = set(state["mounts"])
    netns_roots = ["/run/netns", "/var/run/netns"]
    roots = [str(p).rstrip("/") for p in own_paths] + netns_roots
    for point in reversed(mountpoints()):
        if point not in old_mounts and any(point == r or point.startswith(r + "/") for r in roots):
            unmount(point)
            if any(point.startswith(r + "/") for r in netns_roots):
                # The file CNI bind-mounted the namespace onto: left, `ip netns list` shows it as a dead
                # namespace ("Peer netns reference is invalid"), one per pod the node ever ran.
                with contextlib.suppress(OSError):
                    os.unlink(point)
    for link in links:
        if Path(f"/sys/class/net/{link}").exists():
            subprocess.run(["ip", "link", "delete", link], capture_output=True)
    for binary, before in state["iptables"].items():
        if shutil.which(binary):
            problems += _undo_iptables(binary, before)
    # Tables that did not exist before (iptables-nft creates them on first use), once they hold no rule.
    for table in _nft_tables():
        if table not in state["nft_tables"]:
            listing = subprocess.run(["nft", "list", *table.split()], capture_output=True, text=True).stdout
            rules = [line for line in listing.splitlines() if line.strip() and not line.strip().startswith(
                ("table ", "chain ", "type ", "policy ", "}", "flags "))]
            if not rules:
                subprocess.run(["nft", "delete", *table.split()], capture_output=True)
    for name in cgroups:
        left = remove_cgroup_tree(name)
        if left:
            problems.append(f"cgroups still in use: {left[:3]}")
    for key, value in state["sysctls"].items():
        with contextlib.suppress(OSError):
            if _sysctl_path(key).read_text().strip() != value:
                _sysctl_path(key).write_text(value + "\n")
    return problems
