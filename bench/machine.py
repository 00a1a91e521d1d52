"""Facts about the machine and software a result was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from bench.config import REPO_ROOT


def _cpuinfo() -> dict[str, object]:
    info: dict[str, object] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and "model" not in info:
            info["model"] = value.strip()
        elif key == "flags" and "flags" not in info:
            flags = set(value.split())
            info["flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
    return info


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def machine_info() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "cpu": _cpuinfo(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mem_total_gib": _mem_total_gib(),
        "loadavg_at_start": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "packages": {p: _pkg(p) for p in ("hearth", "llama-cpp-python", "httpx")},
        "git_commit": _git_commit(),
    }
