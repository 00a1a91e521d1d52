"""The model-runner interface the engine drives, and a batch entry.

A runner owns the model, its context (KV cache) and native samplers. It is used only from
the engine thread. `hearth.backends.llamacpp.runner.LlamaCppRunner` is the real one;
`hearth.engine.fake_runner.FakeRunner` is a deterministic stand-in for unit tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hearth.engine.grammar_cache import GrammarCacheStats
from hearth.engine.types import SamplingParams


@dataclass(slots=True)
class BatchEntry:
    """Tokens of one sequence in one decode call, placed at positions pos0, pos0+1, ...

    Logits are computed for the entry's last `n_logits` tokens (0: none; 1: the next-token
    prediction; more: a speculative draft is verified, one prediction per drafted position).
    """

    seq_id: int
    tokens: list[int]
    pos0: int
    n_logits: int = 0


class DecodeAborted(RuntimeError):
    """`Runner.decode` was stopped by `Runner.interrupt()`. Nothing of the batch remains: the
    runner removed every position at or past each entry's `pos0` from the KV, so each sequence
    holds exactly what it held before the call and its work can simply be scheduled again."""


class Sampler(Protocol):
    def sample(self, logits_index: int) -> int:
        """Sample from the logits at `logits_index` of the last decode, and accept the token."""
        ...

    def free(self) -> None: ...


class Runner(Protocol):
    n_vocab: int
    n_ctx_train: int
    n_seq_max: int  # sequence slots in the KV cache
    n_batch: int  # most tokens one decode call takes

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes a generated token contributes to the text (control tokens: b"")."""
        ...

    def token_text(self, token: int) -> bytes:
        """The token as it would be written in a prompt (special tokens spelled out)."""
        ...

    def cuts_text(self, token: int) -> bool:
        """Whether the tokenizer finds this token's text in a prompt before anything else (a
        control or user-defined token, spelled out): the text after it tokenizes on its own,
        whatever came before (hearth.backends.local.prefix_tokens relies on it)."""
        ...

    def is_eog(self, token: int) -> bool: ...

    def decode(self, entries: list[BatchEntry]) -> list[int]:
        """Run one forward pass over all entries; return, per entry with n_logits > 0 (in order),
        the index of its first logits row to pass to `Sampler.sample` / `logits` (row j of the
        entry is that index + j). Raises DecodeAborted when interrupted, RuntimeError on failure."""
        ...

    def interrupt(self) -> None:
        """Thread-safe: make the decode in progress (or the next one) stop as soon as it can and
        raise DecodeAborted. A runner that cannot stop midway ignores it."""
        ...

    def clear_interrupt(self) -> None:
        """Engine thread, between decodes: re-arm after `interrupt()`."""
        ...

    def logits(self, logits_index: int) -> np.ndarray: ...

    def new_sampler(self, params: SamplingParams) -> Sampler: ...

    def kv_remove(self, seq_id: int, p0: int, p1: int) -> None:
        """Drop positions [p0, p1) of a sequence (p1 = -1: to the end)."""
        ...

    def kv_copy(self, src: int, dst: int, p0: int, p1: int) -> None: ...

    def state_get(self, seq_id: int) -> bytes:
        """One sequence's KV as bytes (to swap it out or snapshot it)."""
        ...

    def state_bytes_bound(self, n_tokens: int) -> int:
        """An upper bound on `state_get`'s size for a sequence of `n_tokens` tokens."""
        ...

    def state_set(self, seq_id: int, data: bytes) -> None:
        """Replace a sequence's KV with `state_get` bytes; ValueError if they do not fit."""
        ...

    def kv_split(self, data: bytes, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Cut `state_get` bytes into block payloads, one per position range [a, b): the KV of
        those tokens alone, in a form `kv_join` reads (the prompt cache's blocks). ValueError
        if the bytes are not such a state. Pure: safe from any thread."""
        ...

    def kv_join(self, parts: Sequence[tuple[bytes | bytearray, int, int]]) -> bytes:
        """`state_set` bytes of positions 0..N-1 from consecutive block payloads, each given as
        (payload, tokens in it, how many of its first tokens to use). ValueError on a payload
        whose size does not fit its token count. Pure: safe from any thread."""
        ...

    def state_set_blocks(self, seq_id: int, parts: Sequence[tuple[bytes | bytearray, int, int]]) -> None:
        """`state_set(seq_id, kv_join(parts))`, as fast as the runner can (the prompt cache's
        restore: llama.cpp's runner copies each block once, to its place in the state it loads)."""
        ...

    def kv_block_bytes(self, n_tokens: int) -> int:
        """The exact size of a block payload of `n_tokens` tokens. The first call of any of the
        three may decode to learn the layout: make it on the engine thread."""
        ...

    def kv_checked(self, tokens: list[int], data: bytes) -> bytes:
        """Saved KV from outside (an imported snapshot) made safe to load: ValueError unless
        `data` is laid out as this runner lays it out, holds positions 0..n-1 with n at least
        len(tokens), and every token is in the vocabulary; the state cut to exactly
        len(tokens) cells (a session trimmed while swapped out keeps more). Engine thread."""
        ...

    @property
    def fingerprint(self) -> dict[str, Any]:
        """Everything `state_get` bytes depend on (model, KV layout, KV type as `kv_type`):
        saved KV loads only into a runner with an equal fingerprint. JSON-serializable."""
        ...

    def check_grammar(self, grammar: str) -> None:
        """Raise ValueError if `grammar` (GBNF with a `root` rule) cannot be used; else compile
        it into this runner's grammar cache (a hit when it is there). Safe from any thread."""
        ...

    def grammar_stats(self) -> GrammarCacheStats:
        """This runner's (this model's) grammar cache: hits, misses, entries."""
        ...

    def close(self) -> None:
        """Free the model and context (after the engine thread has stopped)."""
        ...
