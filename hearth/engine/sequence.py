"""The state of a request while the engine owns it: one `Sequence` per candidate."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum

from hearth.engine.detokenizer import Detokenizer
from hearth.engine.kv import Slot
from hearth.engine.repetition import RepetitionTracker
from hearth.engine.runner import Sampler
from hearth.engine.speculate import Drafter
from hearth.engine.thinking import ThinkTracker
from hearth.engine.types import EngineRequest, FinishReason, RequestOutput, SamplingParams

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

    @classmethod
    def start(cls, req: EngineRequest, index: int, slot: Slot,
              new_sampler: Callable[[SamplingParams], Sampler]) -> Sequence:
        """Candidate `index` of `req`, in `slot`: its sampler, stop strings, thinking budget and
        loop detector."""
        params = req.params
        p = params
        if index and params.seed is not None:  # candidates must differ, reproducibly
            p = replace(params, seed=params.seed + index)
        # A grammar owns every token: a forced end-of-thinking marker would break it.
        think = ThinkTracker(req.think) if req.think is not None and p.grammar is None else None
        rep = req.repetition
        repeat = RepetitionTracker(rep) if rep is not None and rep.enabled else None
        return cls(index, slot, new_sampler(p), Detokenizer(list(params.stop)), think=think, repeat=repeat)

    @classmethod
    def placeholder(cls, index: int, slot: Slot) -> Sequence:
        """A candidate that never samples: it holds its slot until a request that failed to
        start is ended."""
        return cls(index, slot, _NullSampler(), Detokenizer())


@dataclass(slots=True)
class ActiveRequest:
    req: EngineRequest
    sink: Sink
    max_len: int  # prompt + generated tokens may not exceed this
    phase: Phase = Phase.WAITING
    seqs: list[Sequence] = field(default_factory=list)
    prefill_pos: int = 0  # prompt tokens already in the first slot's KV
    prefill_chunks: int = 0  # prompt chunks decoded for it (chunked prefill: one per step it prefilled in)
    cached_tokens: int = 0
    cache_tier: str | None = None  # where the cached prefix came from (RequestOutput.cache_tier)
    arrived: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # set at its first generated token from req.max_time (Engine._expire)
    reprefilled: bool = False  # its restored KV failed a decode and was dropped (restart_prefill)

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def prompt(self) -> list[int]:
        return self.req.prompt_tokens

    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if s.finish is None]

    def restart_prefill(self) -> bool:
        """After a failed decode (its slots already emptied): a session turn still prefilling on
        KV it did not compute itself (swapped in, or loaded from a snapshot, which a hostile
        archive may have crafted) starts its prefill again from the first token, once, instead
        of failing: the turn answers as if the session had no KV. True if it does."""
        if self.req.owner is None or self.phase is not Phase.PREFILL or self.cached_tokens == 0 or self.reprefilled:
            return False
        self.reprefilled = True
        self.prefill_pos = self.cached_tokens = 0
        self.cache_tier = None
        return True


class _NullSampler:
    def sample(self, logits_index: int) -> int:
        raise RuntimeError("no sampler")

    def free(self) -> None:
        pass
