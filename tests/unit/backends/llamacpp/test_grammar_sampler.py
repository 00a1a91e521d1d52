"""The grammar sampler against the real model: the pick-then-check path (NativeSampler), with
llguidance's mask on a refusal and with the native full walk alone, and the old grammar-first
chain agree token for token at temperature 0; llguidance's mask and llama.cpp's grammar agree
on every refusal; a refused token is never returned (sampled or not); and the grammar cache
belongs to one model's runner."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import llama_cpp as L
import pytest

from hearth.backends.llamacpp.runner import LlamaCppRunner
from hearth.backends.llamacpp.sampler import NativeSampler
from hearth.chat.structured import schema_grammar, tool_call_grammar
from hearth.chat.types import Tool
from hearth.engine.runner import BatchEntry
from hearth.engine.types import SamplingParams
from hearth.models import embedded_model_path

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 18,
                                                                          "exclusiveMaximum": 120}},
     "required": ["name", "age"]},
    {"type": "array", "items": {"type": "number", "minimum": -2, "maximum": 7}, "minItems": 2, "maxItems": 4},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                        "required": ["v", "kids"]}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
     "required": ["colour", "ok"]},
    {"type": "object"},
]
WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"},
                                                                     "days": {"type": "integer", "minimum": 1,
                                                                              "maximum": 7}},
                                   "required": ["city", "days"]})
GRAMMARS = [schema_grammar(s) for s in SCHEMAS] + [tool_call_grammar([WEATHER], "hermes", False),
                                                   'root ::= "yes" | "no" | [0-9]{1,3}']
PROMPT = "Answer in JSON. The user is Ada, 36, likes blue.\n"


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaCppRunner]:
    r = LlamaCppRunner(embedded_model_path(), seq_ctx=512, n_seq_max=1, n_batch=128, n_threads=2)
    yield r
    r.close()


def _old_chain(r: LlamaCppRunner, grammar: str, params: SamplingParams) -> Any:
    """The chain as it was before: the grammar first, over every candidate, every token."""
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_grammar(r.vocab, grammar.encode(), b"root"))
    if params.repetition_penalty != 1.0:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(r.n_vocab, params.penalty_last_n,
                                                                        params.repetition_penalty, 0.0, 0.0))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
    return chain


def _run(r: LlamaCppRunner, grammar: str, params: SamplingParams, n: int = 40,
         mask: bool = True) -> tuple[list[int], list[int], NativeSampler]:
    """Decode under both samplers from the same logits; stop at the first difference or EOG."""
    r.kv_remove(0, 0, -1)
    r.check_grammar(grammar)  # as a request does: compiles it, with llguidance's matcher
    new = r.new_sampler(params)
    assert (new._mask is not None) is True  # every grammar here is one llguidance takes
    if not mask:
        new._mask = None  # the native full walk on every refusal
    old = _old_chain(r, grammar, params)
    prompt = r.tokenize(PROMPT, add_special=True, parse_special=False)
    got_new: list[int] = []
    got_old: list[int] = []
    try:
        entry = BatchEntry(0, prompt, 0, 1)
        for _ in range(n):
            (row,) = r.decode([entry])
            a = new.sample(row)
            b = int(L.llama_sampler_sample(old, r.ctx, row))
            got_new.append(a)
            got_old.append(b)
            if a != b or r.is_eog(a):
                break
            entry = BatchEntry(0, [a], entry.pos0 + len(entry.tokens), 1)
    finally:
        new.free()
        L.llama_sampler_free(old)
    return got_new, got_old, new


@pytest.mark.parametrize("mask", [True, False], ids=["llguidance", "native"])
@pytest.mark.parametrize("i", range(len(GRAMMARS)))
def test_greedy_under_a_grammar_matches_the_grammar_first_chain(runner: LlamaCppRunner, i: int, mask: bool) -> None:
    got_new, got_old, s = _run(runner, GRAMMARS[i], SamplingParams(temperature=0.0, grammar=GRAMMARS[i]), mask=mask)
    assert got_new == got_old
    assert len(got_new) >= 2
    assert s.refusals > 0  # this prompt does not lead the model into the grammar: the mask is used
    assert s.walks == (0 if mask else s.refusals)  # llguidance never disagreed with llama.cpp


@pytest.mark.parametrize("mask", [True, False], ids=["llguidance", "native"])
def test_greedy_with_a_penalty_matches_too(runner: LlamaCppRunner, mask: bool) -> None:
    g = GRAMMARS[0]
    got_new, got_old, s = _run(runner, g, SamplingParams(temperature=0.0, grammar=g, repetition_penalty=1.3),
                               mask=mask)
    assert got_new == got_old and s.refusals > 0 and s.walks == (0 if mask else s.refusals)


def test_a_refused_pick_is_never_returned(runner: LlamaCppRunner) -> None:
    """A grammar the model would never write on its own (digits only, then EOS): every pick is
    refused at first, and every token returned is one the grammar allows; sampled and greedy."""
    g = 'root ::= [0-9] [0-9] [0-9]'
    for params in (SamplingParams(temperature=0.0, grammar=g), SamplingParams(temperature=1.5, seed=7, grammar=g),
                   SamplingParams(temperature=0.0, grammar=g, logit_bias={15: 50.0})):
        runner.kv_remove(0, 0, -1)
        runner.check_grammar(g)
        s = runner.new_sampler(params)
        entry = BatchEntry(0, runner.tokenize("Once upon a time", add_special=True, parse_special=False), 0, 1)
        text = b""
        try:
            for _ in range(8):
                (row,) = runner.decode([entry])
                tok = s.sample(row)
                if runner.is_eog(tok):
                    break
                text += runner.token_bytes(tok)
                entry = BatchEntry(0, [tok], entry.pos0 + len(entry.tokens), 1)
        finally:
            s.free()
        assert len(text) == 3 and text.isdigit(), (params, text)
        assert s.refusals > 0 and s.walks == 0


def test_seeded_sampling_under_a_grammar_is_reproducible(runner: LlamaCppRunner) -> None:
    g = GRAMMARS[0]
    outs = []
    for _ in range(2):
        runner.kv_remove(0, 0, -1)
        s = runner.new_sampler(SamplingParams(temperature=1.0, seed=11, top_k=40, grammar=g))
        entry = BatchEntry(0, runner.tokenize(PROMPT, add_special=True, parse_special=False), 0, 1)
        toks = []
        try:
            for _ in range(24):
                (row,) = runner.decode([entry])
                tok = s.sample(row)
                toks.append(tok)
                if runner.is_eog(tok):
                    break
                entry = BatchEntry(0, [tok], entry.pos0 + len(entry.tokens), 1)
        finally:
            s.free()
        outs.append(toks)
    assert outs[0] == outs[1]


def test_the_grammar_cache_compiles_once_per_model(runner: LlamaCppRunner) -> None:
    g = 'root ::= "cached" [0-9]'
    before = runner.grammar_stats()
    runner.check_grammar(g)
    runner.check_grammar(g)
    runner.new_sampler(SamplingParams(temperature=0.0, grammar=g)).free()
    after = runner.grammar_stats()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    with pytest.raises(ValueError):
        runner.check_grammar("root ::= (")
    # Another runner (another model's, or another load of this one) starts empty: it compiles
    # its own copy against its own vocabulary.
    other = LlamaCppRunner(embedded_model_path(), seq_ctx=64, n_seq_max=1, n_batch=16, n_threads=1)
    try:
        other.check_grammar(g)
        assert (other.grammar_stats().misses, other.grammar_stats().hits) == (1, 0)
    finally:
        other.close()
