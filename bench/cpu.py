"""CPU accounting around a measurement: how much CPU the server, the client and everything else used.

On a shared machine "everything else" (foreign CPU) tells whether a number can be trusted.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _system_busy_s() -> float:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    guest = sum(values[8:10]) if len(values) > 9 else 0  # already counted in user/nice
    return (sum(values) - idle - guest) / _HZ


def session_cpu_s(sid: int) -> float:
    """utime+stime of every live process in session `sid` (a server started with start_new_session)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        rest = text[text.rfind(")") + 2 :].split()
        # rest[0] is field 3 (state); session is field 6, utime/stime are fields 14/15.
        if int(rest[3]) == sid:
            total += int(rest[11]) + int(rest[12])
    return total / _HZ


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class CpuSnapshot:
    wall: float
    busy: float
    server: float
    client: float

    @classmethod
    def take(cls, server_sid: int) -> CpuSnapshot:
        return cls(time.perf_counter(), _system_busy_s(), session_cpu_s(server_sid), _self_cpu_s())


def cpu_usage(start: CpuSnapshot, end: CpuSnapshot) -> dict[str, float]:
    """Seconds of CPU over the interval; `foreign_share` = other processes / (wall * cores)."""
    wall = end.wall - start.wall
    busy = end.busy - start.busy
    server = end.server - start.server
    client = end.client - start.client
    foreign = max(busy - server - client, 0.0)
    cores = os.cpu_count() or 1
    return {
        "wall_s": round(wall, 3),
        "busy_s": round(busy, 3),
        "server_s": round(server, 3),
        "client_s": round(client, 3),
        "foreign_s": round(foreign, 3),
        "foreign_share": round(foreign / (wall * cores), 4) if wall > 0 else 0.0,
    }


def busy_share(interval_s: float = 1.0) -> float:
    """Fraction of all cores busy over `interval_s`."""
    start_busy, start = _system_busy_s(), time.perf_counter()
    time.sleep(interval_s)
    elapsed = time.perf_counter() - start
    return (_system_busy_s() - start_busy) / (elapsed * (os.cpu_count() or 1))


def wait_idle(timeout_s: float, threshold: float = 0.1) -> float:
    """Wait (up to timeout_s) until the machine is idle for 3 s running; return the last busy share."""
    deadline = time.monotonic() + timeout_s
    share = busy_share()
    quiet = 0
    while time.monotonic() < deadline:
        quiet = quiet + 1 if share < threshold else 0
        if quiet >= 3:
            break
        share = busy_share()
    return share
