"""The `structured` A/B section: constrained output against each server's own plain decode.

Per round, every server (alternated) answers three requests from the same tagged prompt at
temperature 0: plain (ignore_eos, the decode section's request), a JSON-schema answer
(response_format json_schema) and a forced tool call (tool_choice "required"). Speed is decode
tok/s from the first streamed chunk to the last (content or tool-call arguments), so the
prefill and the token count do not enter; the ratios are per round, constrained over the same
server's plain decode, and Hearth's constrained over llama-server's.

Grammar compile time is measured in process on Hearth's own path (schema → GBNF text → the
model's compiled grammar): uncached (a fresh schema each time) and cached (the same schema
again), p50 and p90 of `compile_runs` each."""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import httpx

from bench.ab.client import Stream, chat_body, metrics, stream_chat
from bench.ab.group import alternate, ratios, started, summary
from bench.ab.sections import HEARTH, LLAMA, AbConfig, _client, _key, _stream_record
from bench.ab.texts import STORY
from bench.config import Settings
from bench.stats import percentile

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
        "characters": {"type": "array", "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "role": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "role", "age"]}},
        "story": {"type": "string"},
    },
    "required": ["title", "year", "characters", "story"],
}
WRITE_FILE: dict[str, Any] = {"type": "function", "function": {
    "name": "write_file", "description": "Write a text file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}}}
KINDS = ("plain", "json", "tool")


def _body(kind: str, r: int, max_tokens: int) -> dict[str, Any]:
    tag = f"[s-{kind}-{r}]"
    if kind == "plain":
        return chat_body([{"role": "user", "content": f"{tag} {STORY}"}], max_tokens, ignore_eos=True)
    if kind == "json":
        return chat_body([{"role": "user", "content": f"{tag} {STORY} Answer as a JSON object."}], max_tokens,
                         ignore_eos=False, response_format={"type": "json_schema", "json_schema": {
                             "name": "story", "schema": SCHEMA}})
    return chat_body([{"role": "user", "content": f"{tag} {STORY} Save it to story.txt."}], max_tokens,
                     ignore_eos=False, tools=[WRITE_FILE], tool_choice="required")


async def structured(s: Settings, cfg: AbConfig, log: Any, compile_runs: int = 50) -> dict[str, Any]:
    variants = [HEARTH, LLAMA]
    names = [v.name for v in variants]
    async with started(variants, s, log) as members, _client(s) as client:

        async def one(name: str, r: int) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for kind in KINDS:
                st: Stream = await stream_chat(client, members[name].url, _body(kind, r, cfg.max_tokens))
                out[kind] = _stream_record(st)
                out[kind]["chunks"] = len(st.token_times)
            for kind in ("json", "tool"):
                p, c = out["plain"]["decode_tps"], out[kind]["decode_tps"]
                out[f"{kind}/plain"] = c / p if p and c else None
            return out

        log(f"structured: {cfg.rounds} rounds (plain, json schema, forced tool call)")
        rounds = await alternate(names, cfg.rounds, one, members)
        hearth_metrics = await _grammar_metrics(client, members["hearth"].url)
    res: dict[str, Any] = {"servers": names, "rounds": rounds, "hearth_grammar_cache": hearth_metrics}
    for kind in ("json", "tool"):
        for name in names:
            res[f"{name} {kind}/plain"] = summary([v for rec in rounds
                                                   if (v := rec[name]["value"][f"{kind}/plain"]) is not None])
        def tps(v: Any, k: str = kind) -> float | None:
            value: float | None = v[k]["decode_tps"]
            return value

        res[f"hearth/llama-server {kind}"] = summary(ratios(rounds, "hearth", "llama-server", tps))
        res[f"tokens {kind}"] = {n: [rec[n]["value"][kind]["n_tokens"] for rec in rounds] for n in names}
    res["hearth/llama-server plain"] = summary(ratios(rounds, "hearth", "llama-server",
                                                      lambda v: _key("decode_tps")(v["plain"])))
    res["compile"] = compile_times(s, compile_runs)
    return res


async def _grammar_metrics(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    m = await metrics(client, url)
    return {k: v for k, v in m.items() if k.startswith("hearth_grammar_cache")}


def compile_times(s: Settings, runs: int) -> dict[str, Any]:
    """Schema → grammar on Hearth's path, in this process: uncached vs cached, in ms."""
    from hearth.backends.llamacpp.runner import LlamaCppRunner
    from hearth.chat.structured import converted, schema_grammar, tool_call_grammar
    from hearth.chat.types import Tool

    runner = LlamaCppRunner(s.model, seq_ctx=64, n_seq_max=1, n_batch=16, n_threads=1)
    try:
        def once(i: int, kind: str) -> float:
            t0 = time.perf_counter()
            if kind == "json":
                schema = copy.deepcopy(SCHEMA)
                # A new grammar each time, not only a new schema text: descriptions do not reach the
                # grammar, so a changed description would be a cache hit in the runner.
                schema["properties"]["year"]["maximum"] = 2100 + i
                grammar = schema_grammar(schema)
            else:
                fn = WRITE_FILE["function"]
                grammar = tool_call_grammar([Tool(f"{fn['name']}_{i}", fn["description"], fn["parameters"])],
                                            "hermes", False)
            runner.check_grammar(grammar)
            return (time.perf_counter() - t0) * 1e3

        out: dict[str, Any] = {}
        for kind in ("json", "tool"):
            converted.clear()
            uncached = [once(i, kind) for i in range(runs)]
            cached = [once(i, kind) for i in range(runs)]  # the same texts again: hits
            out[kind] = {"uncached_ms": {"p50": statistics.median(uncached), "p90": percentile(uncached, 90)},
                         "cached_ms": {"p50": statistics.median(cached), "p90": percentile(cached, 90)}}
        st = runner.grammar_stats()
        out["runner_cache"] = {"hits": st.hits, "misses": st.misses}
        return out
    finally:
        runner.close()
