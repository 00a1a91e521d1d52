"""What a model's first request would otherwise initialise lazily, done at load, before the
server says it is ready (issue 38: the first answer after a restart).

A fresh process's first chat request paid, on top of its own work: the chat template's first
render (Jinja compiles it), the tokenizer's first calls, the tool-call planning and output
parsers' first use, the first sampler chain, and for a constrained answer llguidance's
tokenizer over the whole vocabulary (~1 s for 49k tokens). `warm_up` runs one small chat
request's preparation (a system message, a user message and one tool, through the same
`prepare` a request takes: render, tokenize, parsers), builds and frees one sampler on the
engine thread, and builds llguidance's tokenizer. Nothing here touches the KV cache or the
prompt cache, so what a client sees afterwards is what a warm process would give.

`prefetch_recent` then reads the prompt cache's blocks of the most recently used prompts from
disk into RAM (PrefixCache.prefetch_recent, in this worker thread, never the engine's), so the
first requests after a restart find them in RAM instead of reading them: at most
`EngineSettings.prompt_cache_prefetch` prompts (4) and `prompt_cache_prefetch_mb` (512 MB, and
never more than the cache's RAM budget), and never past PREFETCH_WAIT_S (2 s: ~1 GB/s disk
reads the whole default bound in half that). Every block is checked as a request's prefetch
checks it: a corrupt or foreign one is dropped (and its descendants) and never loaded. What
the bound leaves out is read by the request that needs it, as before.

A warm-up step that fails is logged and skipped: it never fails the load (the first request
then pays what it would have paid anyway, and meets the same error as a 4xx if it is one).
"""

from __future__ import annotations

import logging
import time

from hearth.backends.local.model import EngineSettings, LocalModel
from hearth.backends.local.prepare import prepare
from hearth.chat.types import ChatRequest, Message, Tool
from hearth.engine.types import SamplingParams

log = logging.getLogger("hearth.backend")

PREFETCH_WAIT_S = 2.0  # the most the start prefetch delays readiness

_TOOL = Tool("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}},
                                            "required": ["path"]})


def warm_request(model_id: str) -> ChatRequest:
    """The small request whose preparation warms the template, tokenizer and parsers."""
    return ChatRequest(model=model_id, messages=[Message("system", "You are a helpful assistant."),
                                                 Message("user", "Hello.")],
                       tools=[_TOOL], sampling=SamplingParams(max_tokens=1, temperature=0.0),
                       cache_prompt=False)


def warm_up(m: LocalModel) -> dict[str, float]:
    """Blocking (the loader's worker thread, the engine thread started): warm `m`; returns the
    seconds each step took (what a first request no longer pays)."""
    took: dict[str, float] = {}

    def step(name: str, fn: object) -> None:
        t = time.perf_counter()
        try:
            fn()  # type: ignore[operator]
        except Exception as e:
            log.warning("warm-up of %s: %s failed (%s); the first request does it", m.spec.id, name, e)
        took[name] = time.perf_counter() - t

    step("prepare", lambda: prepare(m, warm_request(m.spec.id)))

    def sampler() -> None:  # on the engine thread, where samplers live
        def build() -> None:
            m.runner.new_sampler(SamplingParams(temperature=0.0)).free()

        m.engine.call(build).result(timeout=30)

    step("sampler", sampler)
    masks = getattr(m.runner, "masks", None)  # the llama.cpp runner's llguidance tokenizer
    if masks is not None:
        step("llguidance", masks.prepare)
    log.info("warm-up of %s: %s", m.spec.id, ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in took.items()))
    return took


def prefetch_recent(m: LocalModel, settings: EngineSettings) -> tuple[int, int]:
    """Blocking (the loader's worker thread): the recent prompts' blocks read into RAM (see the
    module docstring); returns (prompts now wholly in RAM, bytes read)."""
    cache = m.engine.cache
    if cache is None or settings.prompt_cache_prefetch <= 0 or settings.prompt_cache_prefetch_mb <= 0:
        return 0, 0
    t = time.perf_counter()
    got = cache.prefetch_recent(settings.prompt_cache_prefetch, settings.prompt_cache_prefetch_mb << 20,
                                time.monotonic() + PREFETCH_WAIT_S)
    if got[1]:
        log.info("prompt cache of %s: %d recent prompt(s), %.1f MB read into RAM at start in %.0f ms",
                 m.spec.id, got[0], got[1] / 1e6, (time.perf_counter() - t) * 1000)
    return got


def ready_model(m: LocalModel, settings: EngineSettings) -> LocalModel:
    """A loaded model made ready for its first request: warmed up, its recent prompts' blocks in
    RAM (blocking: the loader's worker thread, before the model counts as loaded)."""
    prefetch_recent(m, settings)
    warm_up(m)
    return m
