"""Token masks from llguidance, for the moment a grammar refuses the model's own pick.

llama.cpp's GBNF sampler stays the authority on every token (it is what Hearth's grammars are
written for, and it checks one token in a few microseconds), but finding *which* tokens it
allows means walking the whole vocabulary through it: ~10 ms a token for SmolLM2's 49k tokens
(more under load), 3x that for Qwen's 152k. llguidance computes the same set as a bitmask in
tens of microseconds (a lexer DFA and an Earley parser over token tries, in Rust, GIL
released). The same GBNF text is converted to its Lark dialect (llguidance.gbnf_to_lark), so
both engines read one grammar; a grammar it cannot take, or a matcher that falls out of step,
just leaves the native full walk in charge (the sampler checks the masked pick natively too).

The tokenizer (every token's bytes, ~1 s for 49k tokens) is built once per runner, on the
first grammar compile, off the engine thread (`check_grammar` runs while the request is
prepared); a grammar compiled on the engine thread before it exists gets no matcher.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

import llama_cpp as L
import llguidance as _lg
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark as _to_lark

log = logging.getLogger("hearth.llamacpp")


# no_forcing: llguidance otherwise allows only the canonical tokenization of bytes the grammar
# forces (after `"` with `kids"` forced, the token `kids` but not `k`), where llama.cpp's
# grammar allows any token that fits; greedy output would then differ from the native path's.
_OPTIONS = '%llguidance {"no_forcing": true}'


class MaskCompiler:
    """Builds llguidance matchers for one model's vocabulary (thread-safe)."""

    def __init__(self, vocab: Any, n_vocab: int, eog_tokens: list[int]) -> None:
        self._vocab = vocab
        self.n_vocab = n_vocab
        self._eog = eog_tokens
        self._tokenizer: Any = None
        self._failed = False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Build the tokenizer if it is not built yet (blocking; call off the engine thread)."""
        if self._tokenizer is not None or self._failed:
            return
        with self._lock:
            if self._tokenizer is None and not self._failed:
                try:
                    self._tokenizer = _tokenizer(self._vocab, self.n_vocab, self._eog)
                except Exception as e:  # an odd vocabulary: the native walk does it all
                    log.warning("llguidance cannot read this vocabulary (%s): grammars use llama.cpp's alone", e)
                    self._failed = True

    def matcher(self, gbnf: str) -> Any:
        """A pristine matcher for `gbnf`, or None (no tokenizer yet, or a grammar it refuses)."""
        tok = self._tokenizer
        if tok is None:
            return None
        try:
            lark = _to_lark(gbnf).replace("%llguidance {}", _OPTIONS, 1)
            m = _lg.LLMatcher(tok, _lg.LLMatcher.grammar_from_lark(lark), log_level=0)
        except Exception as e:
            log.debug("llguidance cannot take this grammar (%s): the native walk enforces it", e)
            return None
        if m.is_error():
            log.debug("llguidance refused this grammar (%s): the native walk enforces it", m.get_error())
            return None
        return m


def _tokenizer(vocab: Any, n_vocab: int, eog: list[int]) -> Any:
    """llguidance's tokenizer over a llama.cpp vocabulary: llguidance.llamacpp's own recipe (each
    token's bytes; control tokens, and user-defined ones spelled <...>, marked special with a
    0xff prefix), on the non-deprecated attribute call. Every end-of-generation token is an EOS
    to it, as each is to llama.cpp's grammar once the grammar is complete."""
    buf = ctypes.create_string_buffer(16 * 1024 + 1)
    tokens: list[bytes] = []
    for t in range(n_vocab):
        n = L.llama_token_to_piece(vocab, t, buf, 16 * 1024, 0, True)
        if n < 0:
            raise ValueError(f"token {t} is longer than 16 KiB")
        piece = buf.raw[:n]
        attr = L.llama_vocab_get_attr(vocab, t)
        if attr & L.LLAMA_TOKEN_ATTR_CONTROL or (
                attr & L.LLAMA_TOKEN_ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
            piece = b"\xff" + piece
        tokens.append(piece)
    fptr = ctypes.cast(L.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    return _lg.LLTokenizer.from_llamacpp(tokens=tokens, vocab_ptr=vocab, tokenize_fptr=fptr,  # type: ignore[attr-defined]
                                         eos_token=list(eog), slices=None)


class Mask:
    """One sequence's matcher and its bitmask buffer."""

    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self.matcher = matcher
        self.n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    def consume(self, token: int) -> bool:
        """Advance with the token the sampler returned; False once out of step (then unused)."""
        return bool(self.matcher.consume_token(token)) and not self.matcher.is_error()

    def allowed(self) -> np.ndarray | None:
        """Which tokens the grammar allows next, as a bool per token; None if the matcher fails."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self.matcher.is_error():
            return None
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.n_vocab]
        return bits.astype(bool)
