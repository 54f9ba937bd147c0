"""Reading ``/proc``: the machine's CPU times (``/proc/stat``), a process tree's ticks (``/proc/PID/stat``) and
the processes listening on a local port (``/proc/net/tcp``). The raw readings the disturbance watch
(:mod:`specledger.mainjob.disturbance`) turns into windows; torch-free, Linux only."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


@dataclass(frozen=True)
class CpuTimes:
    """The ``cpu`` line of ``/proc/stat``, in ticks: everything, the busy part, the stolen part."""

    total: int
    busy: int
    steal: int


@dataclass(frozen=True)
class Reading:
    """One sample: when (``time.monotonic``), the machine's CPU times, and our watched processes' ticks by pid."""

    wall: float
    machine: CpuTimes
    own: dict[int, int]



def parse_proc_stat(text: str) -> CpuTimes:
    """The aggregate ``cpu`` line of ``/proc/stat``: user nice system idle iowait irq softirq steal (guest time
    is inside user already)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            v = [int(x) for x in parts[1:9]] + [0] * max(0, 9 - len(parts))
            return CpuTimes(total=sum(v[:8]), busy=v[0] + v[1] + v[2] + v[5] + v[6], steal=v[7])
    raise ValueError("no aggregate cpu line in /proc/stat")


def parse_pid_stat(text: str) -> tuple[int, int]:
    """(parent pid, utime + stime ticks) of a ``/proc/PID/stat`` line (the command may hold spaces and parens)."""
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])



def _pid_stats() -> dict[int, tuple[int, int]]:
    """(parent, ticks) of every process readable now."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = parse_pid_stat((entry / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue
    return out


def descendants(roots: set[int], parents: dict[int, int]) -> set[int]:
    """``roots`` and every process below them (``parents``: pid -> parent pid)."""
    found, grew = set(roots), True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found and pid not in found}
        found |= more
        grew = bool(more)
    return found


def read(roots: set[int] | None = None) -> Reading:
    """A reading now: the machine's CPU times and the ticks of this process (``roots`` None) or of ``roots``
    and all their descendants (this process's children, a local server and its workers)."""
    machine = parse_proc_stat(Path("/proc/stat").read_text())
    if roots is None:
        own = {os.getpid(): parse_pid_stat(Path("/proc/self/stat").read_text())[1]}
    else:
        stats = _pid_stats()
        tree = descendants(roots, {pid: parent for pid, (parent, _) in stats.items()})
        own = {pid: stats[pid][1] for pid in tree if pid in stats}
    return Reading(time.monotonic(), machine, own)


def listening_pids(port: int) -> set[int]:
    """Processes (of those we may read) listening on TCP ``port``: ``/proc/net/tcp{,6}`` LISTEN sockets, then
    the processes holding them."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = Path("/proc/net", name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{parts[9]}]")
    pids = set()
    for entry in Path("/proc").iterdir() if inodes else []:
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def local_servers(urls: Iterable[str | None]) -> set[int]:
    """The processes serving the local ones of ``urls`` (localhost, 127.x, ::1, 0.0.0.0): their CPU is the
    load being measured, not a disturbance."""
    pids: set[int] = set()
    for url in urls:
        if not url:
            continue
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if host in ("localhost", "::1", "0.0.0.0") or host.startswith("127."):
            pids |= listening_pids(parts.port or (443 if parts.scheme == "https" else 80))
    return pids


__all__ = ["CpuTimes", "Reading", "descendants", "listening_pids", "local_servers", "parse_pid_stat",
           "parse_proc_stat", "read"]
