"""Server settings: one place, filled from CLI flags and HEARTH_* environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"HEARTH_{name}", default)


def default_data_dir() -> Path:
    home = os.environ.get("HEARTH_HOME")
    return Path(home) if home else Path(platformdirs.user_data_dir("hearth"))


@dataclass(slots=True)
class Settings:
    models: list[str] = field(default_factory=lambda: ["default"])
    host: str = "127.0.0.1"
    port: int = 8000
    ctx: int | None = None  # tokens per sequence; None: the model's training context
    parallel: int = 4
    threads: int | None = None
    batch: int = 512
    kv_unified: bool = True
    data_dir: Path = field(default_factory=default_data_dir)
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not 1 <= self.parallel <= 256:
            raise ValueError("--parallel must be between 1 and 256")
        if self.ctx is not None and self.ctx < 16:
            raise ValueError("--ctx must be at least 16")
        if self.batch < self.parallel:
            raise ValueError("--batch must be at least --parallel")
        if self.threads is not None and self.threads < 1:
            raise ValueError("--threads must be at least 1")
        if not 0 < self.port < 65536:
            raise ValueError("--port must be in 1..65535")


def env_default(name: str, default: str) -> str:
    return _env(name, default) or default
