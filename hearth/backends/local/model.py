"""One model served by the local backend: its runner, engine thread, chat template, admission
queue and the settings they are built from."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hearth.backends.base import ModelCard, ModelLimits
from hearth.backends.local.admission import AdmissionQueue
from hearth.backends.local.prompt_size import check_fits, longest_token
from hearth.chat.reasoning import think_markers
from hearth.chat.system_turns import renders_late_system
from hearth.chat.template import ChatTemplate
from hearth.chat.tool_parsers import PARSERS
from hearth.chat.tools import knows_tools, resolve_parser
from hearth.engine import Engine
from hearth.engine.prefix_cache import PrefixCache
from hearth.engine.runner import Runner
from hearth.engine.speculate import SpecConfig
from hearth.engine.swap import SwapStore
from hearth.hashing import sampled_digest
from hearth.models import ModelSpec
from hearth.test_gate import wait_at_gate


@dataclass(slots=True)
class EngineSettings:
    ctx: int | None = None  # tokens per sequence (prompt + completion); None: the model's own
    parallel: int = 4  # sequence slots decoded together
    threads: int | None = None
    batch: int = 512  # tokens per engine step (decode tokens + prefill chunks)
    # One KV stream per sequence (not one buffer shared by all): each sequence attends only to
    # its own cells, which is faster, and where other traffic left its cells cannot change this
    # sequence's logits, so temperature 0 is reproducible. Same memory either way.
    kv_unified: bool = False
    kv_type: str = "f16"  # KV cache element type: f16, q8_0 or q4_0 (recorded in snapshots)
    # Prompt-lookup speculative decoding: most tokens drafted per sequence per step (0: off).
    spec_draft: int = 8
    max_waiting: int = 64  # requests queued for a slot before new ones get 429
    max_wait: float = 60.0  # seconds a request may queue before it gets 429
    tool_parser: str = "auto"  # auto (from the chat template) or a name in hearth.chat.tool_parsers
    kv_dir: Path | None = None  # where swapped session KV spills (per model); None: RAM only
    session_ram_mb: int = 2048  # host RAM for swapped-out session KV before it spills to disk
    prompt_cache_mb: int = 1024  # host RAM for the prompt cache (stateless prompts' KV, in blocks)
    prompt_cache_disk_mb: int = 8192  # disk for the prompt cache under cache_dir (0: RAM only)
    cache_dir: Path | None = None  # where the prompt cache keeps its blocks (per model); None: RAM only
    # At load, before the model counts as loaded: the blocks of this many most recently used
    # prompts read from disk into RAM, at most prompt_cache_prefetch_mb (hearth.backends.local.warmup).
    prompt_cache_prefetch: int = 4
    prompt_cache_prefetch_mb: int = 512
    strict_max_tokens: bool = False  # a max_tokens past the context is a 400 (else lowered to what is left)

    def __post_init__(self) -> None:
        if self.tool_parser != "auto" and self.tool_parser not in PARSERS:
            raise ValueError(f"--tool-parser must be auto or one of {', '.join(PARSERS)}")


@dataclass(slots=True)
class LocalModel:
    spec: ModelSpec
    runner: Runner
    engine: Engine
    template: ChatTemplate
    card: ModelCard
    admission: AdmissionQueue
    longest_token: int  # bytes of text the longest token stands for (hearth.backends.local.prompt_size)
    aliases: set[str] = field(default_factory=set)
    tool_parser: str = "hermes"
    native_tools: bool = False  # the template renders tools (else Hearth describes them as text)
    late_system: bool = True  # the template renders a system message after a user message, in place
    think: tuple[str, str] = ("<think>", "</think>")

    def check_fits(self, text: str) -> None:
        """ContextLimit when the length of `text` alone proves it cannot fit a sequence; O(1)."""
        check_fits(text, self.longest_token, self.engine.seq_ctx)

    def tokenize_text(self, text: str, add_special: bool) -> list[int]:
        """Special tokens spelled in `text` are parsed (a rendered template carries its own).
        Text that cannot fit is refused before the tokenizer's linear work starts."""
        self.check_fits(text)
        return self.runner.tokenize(text, add_special=add_special, parse_special=True)

    @property
    def limits(self) -> ModelLimits:
        return ModelLimits(self.engine.seq_ctx, self.runner.n_seq_max)


RunnerFactory = Callable[[ModelSpec, EngineSettings], tuple[Runner, ModelCard, ChatTemplate]]


def llamacpp_factory(spec: ModelSpec, settings: EngineSettings) -> tuple[Runner, ModelCard, ChatTemplate]:
    from hearth.backends.llamacpp.runner import LlamaCppRunner

    runner = LlamaCppRunner(spec.path, seq_ctx=settings.ctx, n_seq_max=settings.parallel,
                            n_batch=settings.batch, n_threads=settings.threads,
                            kv_unified=settings.kv_unified, kv_type=settings.kv_type)
    info = runner.info
    card = ModelCard(id=spec.id, created=int(spec.path.stat().st_mtime), meta={
        "path": str(spec.path), "description": info.description, "n_params": info.n_params,
        "size_bytes": info.size_bytes, "n_ctx_train": info.n_ctx_train, "n_ctx": runner.seq_ctx,
        "n_vocab": info.n_vocab, "architecture": info.architecture, "parallel": settings.parallel,
        "kv_type": settings.kv_type,
    })
    template = ChatTemplate(info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)
    return runner, card, template


def load_model(spec: ModelSpec, settings: EngineSettings, factory: RunnerFactory) -> LocalModel:
    """Build the runner and start its engine thread (blocking: call it in a worker thread)."""
    wait_at_gate(spec.id)  # tests only (HEARTH_TEST_GATE): at once otherwise
    runner, card, template = factory(spec, settings)
    seq_ctx = int(card.meta.get("n_ctx") or runner.n_ctx_train)
    folder = model_folder(spec)
    kv_dir, cache_dir = settings.kv_dir, settings.cache_dir
    swap = SwapStore(kv_dir / folder if kv_dir else None, settings.session_ram_mb << 20, runner.fingerprint)
    speculation = SpecConfig(k_max=settings.spec_draft) if settings.spec_draft > 0 else None
    engine = Engine(runner, seq_ctx=seq_ctx, token_budget=settings.batch, swap=swap, spec=speculation,
                    name=f"engine-{spec.id}")
    engine.start()
    # The runner learns its KV block layout on the engine thread (it may decode to do so: see
    # LlamaCppRunner._layout); the cache's start scan needs it to check block sizes.
    engine.call(lambda: runner.kv_block_bytes(1)).result()
    # The cache's identity adds the weights' sampled digest to the runner's fingerprint: a model
    # file replaced under the same name (another fine-tune, same size) must not find these blocks.
    # (A runner without a file, the tests' fake one, has only its fingerprint.)
    cache_identity = {**runner.fingerprint,
                      "weights": sampled_digest(spec.path) if spec.path.is_file() else None}
    engine.attach_cache(PrefixCache(runner, cache_identity, directory=cache_dir / folder if cache_dir else None,
                                    ram_budget=settings.prompt_cache_mb << 20,
                                    disk_budget=settings.prompt_cache_disk_mb << 20))
    aliases = {spec.id, spec.path.name, spec.path.stem, str(spec.path), *spec.aliases}
    admission = AdmissionQueue(runner.n_seq_max, settings.max_waiting, settings.max_wait)
    engine.scheduler.charge = admission.fair.charge  # the engine's work is what fair shares count
    engine.preempt.on_pause = admission.fair.preempted
    return LocalModel(spec, runner, engine, template, card, admission, longest_token(runner), aliases,
                      tool_parser=resolve_parser(settings.tool_parser, template),
                      native_tools=knows_tools(template), late_system=renders_late_system(template),
                      think=think_markers(template.source))


def model_folder(spec: ModelSpec) -> str:
    """The model's folder name under the swap and prompt-cache directories."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", spec.id)


def unload_model(m: LocalModel) -> None:
    """Stop the model's engine and free its weights and KV (blocking: a worker thread). The
    engine writes its sessions' resident KV to the swap directory first and the prompt cache
    writes what it holds, so both are found again when the model is loaded next
    (`SwapStore` and `PrefixCache` scan their directories when they start)."""
    m.admission.close(f"model {m.spec.id!r} is being unloaded")
    m.engine.stop()
    m.runner.close()


def process_rss() -> int:
    """This process's resident memory in bytes (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
