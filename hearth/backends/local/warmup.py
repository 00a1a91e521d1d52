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
the bound leaves out is read by the request that needs it, as before. `fill_slots` then lays
the newest of those prompts into the empty KV slots (on the engine thread: ~0.03 s per 140 MB),
so the first request after a restart finds its prompt in a slot, as it would have before it.

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


def fill_slots(m: LocalModel) -> int:
    """Blocking (on the engine thread through `Engine.call`): each empty idle KV slot takes the
    KV of one of the most recently used prompts of the default namespace whose blocks the start
    prefetch put in RAM, newest first, so the first request for it reuses the slot in place
    (SlotTable.acquire prefers the slot sharing the longest prefix) with nothing to join or
    load; returns the slots filled. Only the default namespace: a block records its chain's
    root, not the tenant or salt it was made under, and a slot must know its namespace."""
    cache = m.engine.cache
    if cache is None:
        return 0
    slots = [s for s in m.engine.slots.slots if not s.busy and not s.tokens and s.owner is None]
    prompts = cache.recent_prompts(len(slots)) if slots else []
    if not prompts:
        return 0

    def fill() -> int:
        n = 0
        for slot, tokens in zip(slots, prompts, strict=False):
            if slot.busy or slot.tokens or slot.owner is not None:
                continue  # taken meanwhile (cannot happen before the model is loaded; kept safe)
            got = cache.match(tokens)
            if got is None or got.n_tokens < cache.block_tokens:
                continue
            try:
                m.runner.state_set_blocks(slot.seq_id, got.parts)
            except ValueError as e:  # cannot happen for blocks this runner cut
                log.warning("could not fill a slot with a cached prompt: %s", e)
                m.runner.kv_remove(slot.seq_id, 0, -1)
                continue
            slot.tokens[:] = tokens[:got.n_tokens]
            slot.ns = ""
            n += 1
        return n

    filled: int = m.engine.call(fill).result(timeout=60)
    return filled


def ready_model(m: LocalModel, settings: EngineSettings) -> LocalModel:
    """A loaded model made ready for its first request: its recent prompts' blocks in RAM and
    in its idle KV slots, warmed up (blocking: the loader's worker thread, before the model
    counts as loaded). A failure here never fails the load."""
    try:
        if prefetch_recent(m, settings)[0]:
            t = time.perf_counter()
            n = fill_slots(m)
            log.info("prompt cache of %s: %d slot(s) filled with recent prompts in %.0f ms", m.spec.id, n,
                     (time.perf_counter() - t) * 1000)
    except Exception:
        log.exception("the start prefetch of %s failed; requests read their blocks themselves", m.spec.id)
    warm_up(m)
    return m
