"""Incremental detokenization: token pieces → text deltas.

Two guarantees, both needed for streaming:
- a UTF-8 character split across tokens is never emitted half (the incremental decoder
  keeps the partial bytes until the character completes);
- a stop string is never partly streamed: any tail of the pending text that could still
  grow into a stop string is held back until it either matches (and is cut) or cannot.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class StopMatch:
    text: str  # text before the stop string (to emit)
    stop: str  # the stop string that matched


@dataclass(slots=True)
class Detokenizer:
    stop: list[str] = field(default_factory=list)
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    _held: str = ""

    def push(self, piece: bytes) -> str | StopMatch:
        """Feed one token's bytes; return the text that is safe to emit now, or the match."""
        self._held += self._decoder.decode(piece)
        if not self.stop:
            out, self._held = self._held, ""
            return out
        # Earliest full match wins; the text after it is dropped.
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self._held.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            out = self._held[: best[0]]
            self._held = ""
            return StopMatch(out, best[1])
        keep = held_prefix(self._held, self.stop)
        cut = len(self._held) - keep
        out, self._held = self._held[:cut], self._held[cut:]
        return out

    def flush(self) -> str:
        """At the end of a sequence: everything still held back (an unfinished stop prefix,
        or an incomplete UTF-8 sequence rendered as U+FFFD)."""
        out = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return out


def held_prefix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string (or
    marker): the part a streaming parser must hold back until it knows more."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
