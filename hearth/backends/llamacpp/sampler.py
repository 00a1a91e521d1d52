"""A llama.cpp sampler chain for one sequence (the engine's `Sampler` for `LlamaCppRunner`).

Under a grammar the token is picked the way llama.cpp's own server does (common_sampler_sample):
first from the unconstrained logits, then the grammar is asked about that one token; only when
it refuses does the grammar walk the whole vocabulary (setting every token it refuses to -inf)
and the pick is made again from what is left. The old chain put the grammar first, so every
token paid the full walk (49k tokens for SmolLM2, 152k for Qwen: 0.37x plain decode on the
default model); now most tokens pay a one-candidate check.

When it refuses, the allowed set comes from llguidance's token mask (token_mask.py: tens of
microseconds) instead of the native walk (~10-20 ms); the pick from the masked logits is checked
by the native grammar too, and only if llguidance is missing, refuses the grammar or disagrees
does the native full walk decide (and then for the rest of the sequence).

At temperature 0 this is exactly the old result: the first maximum of all the logits, when the
grammar allows it, is also the first maximum of the allowed ones. With sampling, a token the
unconstrained draw picks and the grammar allows is kept (llama.cpp's behaviour too): the draw is
from the model's distribution before the grammar, not renormalised over the allowed tokens,
and a refused pick costs one more draw from the seeded generator (still reproducible per seed).
Either way a token the grammar refuses is never returned.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llama_cpp as L
import numpy as np

from hearth.backends.llamacpp.token_mask import Mask
from hearth.engine.types import SamplingParams

if TYPE_CHECKING:
    from hearth.backends.llamacpp.runner import LlamaCppRunner

log = logging.getLogger("hearth.llamacpp")


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A grammar compiled for one model: llama.cpp's sampler (the authority) and, when llguidance
    takes the grammar, its matcher (the mask on a refusal). Cached pristine; samplers clone it."""

    native: Any  # llama_sampler_p
    matcher: Any  # llguidance.LLMatcher | None

    def clone(self) -> CompiledGrammar:
        return CompiledGrammar(L.llama_sampler_clone(self.native),
                               self.matcher.deep_copy() if self.matcher is not None else None)

    def free(self) -> None:
        L.llama_sampler_free(self.native)


# llama_token_data as numpy sees it, so a candidate array is filled by vectorised copies.
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert _TOKEN_DATA.itemsize == ctypes.sizeof(L.llama_token_data)


class _Candidates:
    """A `llama_token_data_array` over a numpy buffer of `n` candidates."""

    def __init__(self, n: int) -> None:
        self.buf = np.zeros(n, dtype=_TOKEN_DATA)
        self.ids = np.arange(n, dtype=np.int32)
        self.arr = L.llama_token_data_array()
        self.ptr = ctypes.pointer(self.arr)
        self._data = ctypes.cast(self.buf.ctypes.data, L.llama_token_data_p)

    def fill(self, logits: np.ndarray) -> None:
        self.buf["id"] = self.ids
        self.buf["logit"] = logits
        self.buf["p"] = 0.0
        self._reset(len(self.buf))

    def one(self, token: int) -> None:
        self.buf[0] = (token, 0.0, 0.0)
        self._reset(1)

    def _reset(self, size: int) -> None:
        arr: Any = self.arr  # `data` is declared as an array; it takes a pointer
        arr.data = self._data
        arr.size = size
        arr.selected = -1
        arr.sorted = False

    def selected(self) -> int:
        return int(self.buf["id"][self.arr.selected])


class NativeSampler:
    """A llama.cpp sampler chain for one sequence: logit bias → penalties → top-k → top-p →
    min-p → temperature → seeded draw (or greedy), with the grammar (if any) checked on the
    pick and applied to every candidate only when it refuses it (see the module docstring).

    Once a grammar is complete it allows only end-of-generation tokens, so ignore_eos does not
    apply under it (as before: EOS comes exactly when the grammar allows it, and only then)."""

    def __init__(self, runner: LlamaCppRunner, params: SamplingParams) -> None:
        self._runner = runner
        self._chain = None
        self._grammar = None
        self._mask: Mask | None = None
        self.refusals = 0  # picks the grammar refused (each then picked again from what it allows)
        self.walks = 0  # of those, the ones the native full walk decided (no mask, or one that disagreed)
        self._cand: _Candidates | None = None
        self._one: _Candidates | None = None
        # Plain greedy is an argmax over the logits row: llama.cpp's chain would first copy all
        # n_vocab logits into a candidate array (~0.15 ms a token here, on the engine thread,
        # while the compute threads wait). Same token: both take the first maximum.
        self._argmax = (params.greedy and not params.logit_bias and params.repetition_penalty == 1.0
                        and not params.frequency_penalty and not params.presence_penalty)
        self._no_eog = params.ignore_eos and params.grammar is None
        if params.grammar is not None:
            try:  # compiled once per model and grammar text; this is a private copy
                compiled = runner.grammars.instance(params.grammar)
            except ValueError:
                raise ValueError("the grammar is not valid GBNF") from None
            self._grammar = compiled.native
            if compiled.matcher is not None:
                self._mask = Mask(compiled.matcher, runner.n_vocab)
            self._one = _Candidates(1)
            if not self._argmax:
                self._cand = _Candidates(runner.n_vocab)
        if self._argmax:
            return
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self._chain = chain
        bias = dict(params.logit_bias)
        if self._no_eog:
            for t in runner.eog_tokens:
                bias[t] = float("-inf")
        if bias:
            arr: Any = (L.llama_logit_bias * len(bias))()  # its fields are declared as ctypes, set as ints
            for i, (tok, b) in enumerate(bias.items()):
                if not 0 <= tok < runner.n_vocab:
                    self.free()
                    raise ValueError(f"logit_bias token {tok} is out of range [0, {runner.n_vocab})")
                arr[i].token = tok
                arr[i].bias = b
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(runner.n_vocab, len(bias), arr))
        if (params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty):
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(
                runner.n_vocab, params.penalty_last_n, params.repetition_penalty,
                params.frequency_penalty, params.presence_penalty))
        if params.greedy:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(params.min_p, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed is not None else L.LLAMA_DEFAULT_SEED
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, logits_index: int) -> int:
        if self._grammar is not None:
            return self._sample_grammar(logits_index)
        if self._argmax:
            row = self._runner.logits(logits_index)
            token = int(np.argmax(row))
            if self._no_eog and self._runner.is_eog(token):  # ignore_eos: as a -inf bias on them
                row = row.copy()
                row[self._runner.eog_tokens] = -np.inf
                token = int(np.argmax(row))
            return token
        return int(L.llama_sampler_sample(self._chain, self._runner.ctx, logits_index))

    def _sample_grammar(self, logits_index: int) -> int:
        row = self._runner.logits(logits_index)
        if self._argmax:
            token = int(np.argmax(row))
        else:
            assert self._cand is not None
            self._cand.fill(row)
            L.llama_sampler_apply(self._chain, self._cand.ptr)
            token = self._cand.selected()
        if not self.allows(token):
            self.refusals += 1
            token = self._pick_allowed(row)
        L.llama_sampler_accept(self._grammar, token)
        if self._mask is not None and not self._mask.consume(token):
            log.debug("llguidance fell out of step with the grammar: the native walk takes over")
            self._mask = None
        if self._chain is not None:
            L.llama_sampler_accept(self._chain, token)  # penalties see the token (the draw keeps no state)
        return token

    def allows(self, token: int) -> bool:
        """Whether the grammar, in its current state, allows `token` next (one candidate: cheap)."""
        one = self._one
        assert one is not None and self._grammar is not None
        one.one(token)
        L.llama_sampler_apply(self._grammar, one.ptr)
        return bool(np.isfinite(one.buf["logit"][0]))

    def _pick_allowed(self, row: np.ndarray) -> int:
        """The pick again, from the tokens the grammar allows: llguidance's mask, checked, or the
        native full walk (the slow path)."""
        if self._cand is None:
            self._cand = _Candidates(self._runner.n_vocab)
        cand = self._cand
        allowed = self._mask.allowed() if self._mask is not None else None
        if allowed is not None:
            if self._chain is None:  # greedy without bias or penalties: the first maximum of what is left
                token = int(np.argmax(np.where(allowed, row, -np.inf)))
            else:
                cand.fill(row)
                cand.buf["logit"][~allowed] = -np.inf
                L.llama_sampler_apply(self._chain, cand.ptr)
                token = cand.selected()
            if self.allows(token):
                return token
            log.debug("llguidance allowed token %d, llama.cpp's grammar did not: the native walk takes over", token)
        self._mask = None
        self.walks += 1
        cand.fill(row)
        L.llama_sampler_apply(self._grammar, cand.ptr)
        if self._chain is None:
            return int(np.argmax(cand.buf["logit"]))  # ids are positions: the grammar does not reorder
        L.llama_sampler_apply(self._chain, cand.ptr)
        return cand.selected()

    def free(self) -> None:
        if self._chain is not None:
            L.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            L.llama_sampler_free(self._grammar)
            self._grammar = None
