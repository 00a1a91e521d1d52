"""A deterministic runner for unit tests: no model, same interface as the real one.

Vocabulary: token ids 0..255 are the bytes 0..255; EOS is 256. The "model" predicts, for
the token at position p, the byte `script[(p + 1) % len(script)]`, so the text a request
generates is predictable from its prompt length alone. It also keeps its own copy of each
sequence's KV and checks that every decode places tokens exactly where the KV ends, so a
scheduling bug that would corrupt a real cache fails loudly here.

`interrupt()` behaves like the real runner's: a decode waiting in `step_delay` (or held by
`hold`) stops, its tokens are rolled back from the KV, and it raises DecodeAborted.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hearth.engine.grammar_cache import GrammarCache, GrammarCacheStats
from hearth.engine.runner import BatchEntry, DecodeAborted
from hearth.engine.types import SamplingParams

EOS = 256


@dataclass
class FakeRunner:
    n_seq_max: int = 4
    n_batch: int = 64
    script: bytes = b"The quick brown fox jumps over the lazy dog. "
    eos_at: int | None = None  # predict EOS for position >= eos_at
    step_delay: float = 0.0
    n_ctx_train: int = 4096
    n_vocab: int = 257
    fail_decodes: int = 0  # the next N decode calls raise
    calls: list[list[BatchEntry]] = field(default_factory=list)
    kv: dict[int, list[int]] = field(default_factory=dict)
    kv_type: str = "fake"  # what the fingerprint names (snapshots refuse another)
    # When set, a decode whose batch holds more than `hold_min_tokens` tokens waits (after
    # writing its KV) until `hold` is cleared or it is interrupted; `held` is set meanwhile.
    hold: threading.Event | None = None
    hold_min_tokens: int = 1
    held: threading.Event = field(default_factory=threading.Event)
    aborted: list[list[BatchEntry]] = field(default_factory=list)  # decodes stopped by interrupt()
    _last_logits: list[np.ndarray] = field(default_factory=list)
    _interrupted: threading.Event = field(default_factory=threading.Event)
    grammars: GrammarCache[str] = field(default_factory=lambda: GrammarCache(_check_gbnf, str, lambda _: None))

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return list(text.encode())

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == EOS else bytes([token])

    def token_text(self, token: int) -> bytes:
        return b"</s>" if token == EOS else bytes([token])

    def cuts_text(self, token: int) -> bool:
        return token != EOS  # one token per byte: the text after any byte tokenizes on its own

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def predict(self, pos: int) -> int:
        nxt = pos + 1
        if self.eos_at is not None and nxt >= self.eos_at:
            return EOS
        return self.script[nxt % len(self.script)]

    def next_token(self, seq: list[int]) -> int:
        """The token the "model" predicts after the sequence `seq` (its whole KV)."""
        return self.predict(len(seq) - 1)

    def decode(self, entries: list[BatchEntry]) -> list[int]:
        if self.fail_decodes:
            self.fail_decodes -= 1
            raise RuntimeError("injected decode failure")
        n_tokens = sum(len(e.tokens) for e in entries)
        if n_tokens > self.n_batch:
            raise RuntimeError("batch larger than n_batch")
        self.calls.append(entries)
        for e in entries:
            seq = self.kv.setdefault(e.seq_id, [])
            if e.pos0 != len(seq):
                raise AssertionError(f"seq {e.seq_id}: decode at {e.pos0} but KV holds {len(seq)} tokens")
            seq.extend(e.tokens)
        if self.step_delay:
            self._interrupted.wait(self.step_delay)
        if self.hold is not None and n_tokens >= self.hold_min_tokens:
            self.held.set()
            while self.hold.is_set() and not self._interrupted.wait(0.005):
                pass
            self.held.clear()
        if self._interrupted.is_set():
            for e in entries:
                del self.kv[e.seq_id][e.pos0:]
            self.aborted.append(entries)
            raise DecodeAborted("interrupted")
        self._last_logits = []
        first: list[int] = []
        for e in entries:
            if not e.n_logits:
                continue
            seq = self.kv[e.seq_id]
            first.append(len(self._last_logits))
            for end in range(e.pos0 + len(e.tokens) - e.n_logits + 1, e.pos0 + len(e.tokens) + 1):
                logits = np.zeros(self.n_vocab, dtype=np.float32)
                logits[self.next_token(seq[:end])] = 10.0
                self._last_logits.append(logits)
        return first

    def interrupt(self) -> None:
        self._interrupted.set()

    def clear_interrupt(self) -> None:
        self._interrupted.clear()

    def logits(self, logits_index: int) -> np.ndarray:
        return self._last_logits[logits_index]

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        return FakeSampler(self, params)

    def kv_remove(self, seq_id: int, p0: int, p1: int) -> None:
        seq = self.kv.setdefault(seq_id, [])
        if p1 < 0:
            del seq[p0:]
        else:
            del seq[p0:p1]

    def kv_copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        assert p0 == -1 and p1 == -1, "the engine copies whole sequences"
        self.kv[dst] = list(self.kv.get(src, []))

    def state_bytes_bound(self, n_tokens: int) -> int:
        return 4 + 4 * n_tokens

    @property
    def fingerprint(self) -> dict[str, Any]:
        return {"fake": 1, "n_vocab": self.n_vocab, "kv_type": self.kv_type}

    def check_grammar(self, grammar: str) -> None:
        """Only the shape llama.cpp insists on: a `root` rule (cached like the real runner's)."""
        self.grammars.compile(grammar)

    def grammar_stats(self) -> GrammarCacheStats:
        return self.grammars.stats()

    def close(self) -> None:
        self.kv.clear()

    def state_get(self, seq_id: int) -> bytes:
        return b"FAKE" + np.asarray(self.kv.get(seq_id, []), dtype="<i4").tobytes()

    def kv_split(self, data: bytes, ranges: list[tuple[int, int]]) -> list[bytes]:
        if not data.startswith(b"FAKE"):
            raise ValueError("not a fake state")
        n = (len(data) - 4) // 4
        if any(not 0 <= a < b <= n for a, b in ranges):
            raise ValueError("block outside the state")
        return [data[4 + 4 * a: 4 + 4 * b] for a, b in ranges]

    def kv_join(self, parts: Sequence[tuple[bytes | bytearray, int, int]]) -> bytes:
        if any(len(p) != 4 * n or not 0 < use <= n for p, n, use in parts):
            raise ValueError("a block payload does not match its token count")
        return b"FAKE" + b"".join(p[: 4 * use] for p, _, use in parts)

    def state_set_blocks(self, seq_id: int, parts: Sequence[tuple[bytes | bytearray, int, int]]) -> None:
        self.state_set(seq_id, self.kv_join(parts))

    def kv_block_bytes(self, n_tokens: int) -> int:
        return 4 * n_tokens

    def kv_checked(self, tokens: list[int], data: bytes) -> bytes:
        if not data.startswith(b"FAKE") or (len(data) - 4) % 4:
            raise ValueError("not a fake state")
        if any(not 0 <= t < self.n_vocab for t in tokens):
            raise ValueError("token id out of range")
        held = np.frombuffer(data[4:], dtype="<i4").tolist()
        if held[:len(tokens)] != tokens:
            raise ValueError("the saved KV does not hold these tokens")
        return data[:4 + 4 * len(tokens)]

    def state_set(self, seq_id: int, data: bytes) -> None:
        self.kv[seq_id] = []
        if not data.startswith(b"FAKE"):
            raise ValueError("not a fake state")
        self.kv[seq_id] = np.frombuffer(data[4:], dtype="<i4").tolist()


def _check_gbnf(grammar: str) -> str:
    if "root" not in grammar or "::=" not in grammar:
        raise ValueError("the grammar is not valid GBNF (no root rule)")
    return grammar


class FakeSampler:
    """Greedy at temperature 0; otherwise a seeded random byte from a-z."""

    def __init__(self, runner: FakeRunner, params: SamplingParams) -> None:
        self.runner = runner
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.freed = False

    def sample(self, logits_index: int) -> int:
        logits = self.runner.logits(logits_index)
        if self.params.greedy:
            return int(np.argmax(logits))
        return int(self.rng.integers(ord("a"), ord("z") + 1))

    def free(self) -> None:
        self.freed = True
