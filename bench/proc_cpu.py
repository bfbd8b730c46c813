"""What the machine's processes did, from /proc: names for a Spark session's processes, and CPU time, page
faults and resident memory per process kind between two snapshots.

Why: on a 2-core machine every pipeline is CPU-bound, so a slow pass is explained by who used the CPU
(the Python workers, the JVM, the broker) and whether it went to user code or the kernel (page faults)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_HZ = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

#: {pid: (label, user s, system s, minor faults, resident bytes)}
Snapshot = dict[int, tuple[str, float, float, int, int]]


def process_label(argv: list[str]) -> str:
    """A short name for a process: `kafka broker`, `jvm`, or the module/script a Python process runs (with its
    worker module for a PySpark daemon, e.g. `pyspark.daemon pyspark.sql.worker.create_data_source`)."""
    if not argv:
        return "?"
    if " " in argv[0] and not any(argv[1:]):  # a title the process set itself (the fork server's forks)
        argv = argv[0].split()
    if os.path.basename(argv[0]).startswith("java"):
        return "kafka broker" if "kafka.Kafka" in argv else "jvm"
    if "-m" in argv:
        i = argv.index("-m")
        return " ".join(argv[i + 1:i + 3])
    return " ".join(os.path.basename(a) for a in argv[1:3])


def settled(argv: list[str]) -> bool:
    """A JVM or a Python process: its command line will not change any more (a launcher script may exec)."""
    return bool(argv) and (os.path.basename(argv[0]).startswith("java") or "python" in os.path.basename(argv[0]))


def pids() -> list[str]:
    return [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]


def argv_of(pid: str) -> list[str]:
    """The process's command line (OSError once it has ended)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


def stat_of(pid: str) -> list[str]:
    """/proc/<pid>/stat after the command name: state ppid pgrp session ... minflt(7) ... utime(11) stime(12)
    ... rss(21, pages)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def snapshot() -> Snapshot:
    """{pid: (label, user s, system s, minor faults, resident bytes)} for every process now."""
    out = {}
    for pid in pids():
        try:
            f, argv = stat_of(pid), argv_of(pid)
        except OSError:
            continue
        out[int(pid)] = (process_label(argv), int(f[11]) / _HZ, int(f[12]) / _HZ, int(f[7]), int(f[21]) * _PAGE)
    return out


def machine_seconds() -> dict[str, float]:
    """The machine's CPU seconds since boot, all cores together (/proc/stat): where a pass's wall time could
    have gone besides the processes (idle cores, I/O wait, time the hypervisor gave to another guest)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) / _HZ for x in fields[:8])
    return {"busy_s": user + nice + system + irq + softirq, "idle_s": idle, "iowait_s": iowait, "steal_s": steal}


def cpu_by_label(before: Snapshot, after: Snapshot, min_s: float = 0.02) -> dict[str, dict[str, Any]]:
    """CPU used between two snapshots, per process label: {label: {user_s, system_s, minor_faults, processes,
    rss_mb}}; `rss_mb` is the processes' resident memory at the second snapshot, summed (pages a forked worker
    shares with its daemon count once per process). A process that ended in between is not counted; labels
    under `min_s` of CPU are left out."""
    per: dict[str, dict[str, Any]] = {}
    for pid, (label, user, system, faults, rss) in after.items():
        _, user0, system0, faults0, _ = before.get(pid, (label, 0.0, 0.0, 0, 0))
        if user - user0 + system - system0 <= 0:
            continue
        acc = per.setdefault(label, {"user_s": 0.0, "system_s": 0.0, "minor_faults": 0, "processes": 0, "rss_mb": 0})
        acc["user_s"] += user - user0
        acc["system_s"] += system - system0
        acc["minor_faults"] += faults - faults0
        acc["processes"] += 1
        acc["rss_mb"] += rss >> 20
    return {k: {**v, "user_s": round(v["user_s"], 2), "system_s": round(v["system_s"], 2)}
            for k, v in sorted(per.items(), key=lambda kv: -(kv[1]["user_s"] + kv[1]["system_s"]))
            if v["user_s"] + v["system_s"] >= min_s}
