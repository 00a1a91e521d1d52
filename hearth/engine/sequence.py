"""The state of a request while the engine owns it: one `Sequence` per candidate."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from hearth.engine.detokenizer import Detokenizer
from hearth.engine.kv import Slot
from hearth.engine.repetition import RepetitionTracker
from hearth.engine.runner import Sampler
from hearth.engine.speculate import Drafter
from hearth.engine.thinking import ThinkTracker
from hearth.engine.types import EngineRequest, FinishReason, RequestOutput

Sink = Callable[[RequestOutput], None]


class Phase(Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass(slots=True)
class Sequence:
    index: int
    slot: Slot
    sampler: Sampler
    detok: Detokenizer
    n_generated: int = 0
    pending: int | None = None  # sampled, emitted, not yet in the KV cache
    finish: FinishReason | None = None
    think: ThinkTracker | None = None
    repeat: RepetitionTracker | None = None
    drafter: Drafter | None = None  # prompt-lookup speculation, once decoding (None: off)
    draft: list[int] = field(default_factory=list)  # this step's drafted tokens, after `pending`


@dataclass(slots=True)
class ActiveRequest:
    req: EngineRequest
    sink: Sink
    max_len: int  # prompt + generated tokens may not exceed this
    phase: Phase = Phase.WAITING
    seqs: list[Sequence] = field(default_factory=list)
    prefill_pos: int = 0  # prompt tokens already in the first slot's KV
    cached_tokens: int = 0
    arrived: float = field(default_factory=time.monotonic)

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def prompt(self) -> list[int]:
        return self.req.prompt_tokens

    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if s.finish is None]
