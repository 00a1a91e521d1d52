"""A llama.cpp sampler chain for one sequence (the engine's `Sampler` for `LlamaCppRunner`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import llama_cpp as L
import numpy as np

from hearth.engine.types import SamplingParams

if TYPE_CHECKING:
    from hearth.backends.llamacpp.runner import LlamaCppRunner


class NativeSampler:
    """A llama.cpp sampler chain for one sequence: grammar → logit bias → penalties → top-k →
    top-p → min-p → temperature → seeded draw (or greedy).

    The grammar comes first so every later stage (greedy included) sees only tokens it allows
    (it sets the others to -inf, and nothing later raises them again); once the grammar is
    complete it allows only end-of-generation tokens, so ignore_eos does not apply to it."""

    def __init__(self, runner: LlamaCppRunner, params: SamplingParams) -> None:
        self._runner = runner
        # Plain greedy is an argmax over the logits row: llama.cpp's chain would first copy all
        # n_vocab logits into a candidate array (~0.15 ms a token here, on the engine thread,
        # while the compute threads wait). Same token: both take the first maximum.
        self._argmax = (params.greedy and params.grammar is None and not params.logit_bias
                        and params.repetition_penalty == 1.0
                        and not params.frequency_penalty and not params.presence_penalty)
        self._no_eog = params.ignore_eos
        self._chain = None
        if self._argmax:
            return
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self._chain = chain
        if params.grammar is not None:
            grammar = L.llama_sampler_init_grammar(runner.vocab, params.grammar.encode(), b"root")
            if not grammar:
                self.free()
                raise ValueError("the grammar is not valid GBNF")
            L.llama_sampler_chain_add(chain, grammar)
        bias = dict(params.logit_bias)
        if params.ignore_eos and params.grammar is None:
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
        if self._argmax:
            row = self._runner.logits(logits_index)
            token = int(np.argmax(row))
            if self._no_eog and self._runner.is_eog(token):  # ignore_eos: as a -inf bias on them
                row = row.copy()
                row[self._runner.eog_tokens] = -np.inf
                token = int(np.argmax(row))
            return token
        return int(L.llama_sampler_sample(self._chain, self._runner.ctx, logits_index))

    def free(self) -> None:
        if self._chain is not None:
            L.llama_sampler_free(self._chain)
            self._chain = None
