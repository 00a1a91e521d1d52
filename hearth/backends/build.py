"""The composition root: the one place that turns settings into a concrete backend. Everything
else (the app, sessions, metrics, the CLI) receives it as a `Backend`."""

from __future__ import annotations

from hearth.backends.base import Backend
from hearth.config import Settings
from hearth.models import ModelSpec


def build_backend(settings: Settings, specs: list[ModelSpec]) -> Backend:
    """The local engine over `specs`; ValueError for settings it cannot run with."""
    from hearth.backends.local.backend import LocalBackend
    from hearth.backends.local.model import EngineSettings

    return LocalBackend(specs, EngineSettings(
        ctx=settings.ctx, parallel=settings.parallel, threads=settings.threads, batch=settings.batch,
        kv_unified=settings.kv_unified, kv_type=settings.kv_type, spec_draft=settings.spec_draft,
        max_waiting=settings.max_waiting, max_wait=settings.max_wait,
        tool_parser=settings.tool_parser, kv_dir=settings.data_dir / "kv", session_ram_mb=settings.session_ram_mb,
        prompt_cache_mb=settings.prompt_cache_mb, prompt_cache_disk_mb=settings.prompt_cache_disk_mb,
        cache_dir=settings.data_dir / "prompt-cache", clamp_max_tokens=settings.clamp_max_tokens))
