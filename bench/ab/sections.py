"""The A/B sections other than cancellation: decode speed (1 and N streams), speculative
decoding on agent workloads, and KV cache types. Each starts its servers side by side and
alternates them round by round (bench.ab.group)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.ab.client import Stream, chat_body, metrics, stream_chat
from bench.ab.group import Member, Variant, alternate, ratios, started, summary
from bench.ab.texts import KV_PROMPTS, STORY, agent_workloads
from bench.config import Settings

HEARTH = Variant("hearth", "hearth")
HEARTH_NOSPEC = Variant("hearth-nospec", "hearth", ("--spec-draft", "0"))
LLAMA = Variant("llama-server", "llama-server")
NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")


@dataclass
class AbConfig:
    rounds: int = 10  # decode rounds (each: every server once, alternating), per set of instances
    # decode: fresh sets of server processes, each started in a rotated order. Two identical
    # servers differ by a few per cent for as long as they live (bench.observability's A/A run),
    # so one instance per server cannot resolve a few per cent; over sets that bias averages out.
    instances: int = 1
    max_tokens: int = 128
    streams: int = 8
    churn_clients: int = 7
    churn_seconds: float = 20.0
    spec_rounds: int = 3
    spec_max_tokens: int = 384
    kv_rounds: int = 3
    kv_prompts: int = len(KV_PROMPTS)
    kv_max_tokens: int = 48
    session_tokens: int = 2048  # "sessions per GiB" counts sessions of this many tokens
    spec_workloads: list[str] | None = None  # None: all of bench.ab.texts.agent_workloads
    # None: every server of the section; else these names (`hearth` always runs: ratios are to it)
    spec_servers: list[str] | None = None


def _client(s: Settings) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(s.request_timeout_s, connect=10.0))


def _stream_record(st: Stream) -> dict[str, Any]:
    return {
        "decode_tps": st.decode_tps,
        "e2e_tps": st.e2e_tps,
        "ttft_s": st.ttft,
        "n_tokens": st.n_tokens,
        "finish_reason": st.finish_reason,
        "error": st.error,
    }


def _key(field: str) -> Any:
    return lambda v: v.get(field)


async def decode(s: Settings, cfg: AbConfig, log: Any) -> dict[str, Any]:
    """Single-stream and N-stream decode, story prompt, ignore_eos, same token count everywhere."""
    variants = [HEARTH, LLAMA, HEARTH_NOSPEC]
    names = [v.name for v in variants]
    one: list[dict[str, Any]] = []
    many: list[dict[str, Any]] = []
    for instance in range(cfg.instances):
        log(f"decode: server set {instance + 1} of {cfg.instances}")
        k = instance % len(variants)
        single, multi = await _decode_rounds(variants[k:] + variants[:k], names, s, cfg, log)
        one += [{**r, "instance": instance} for r in single]
        many += [{**r, "instance": instance} for r in multi]
    out: dict[str, Any] = {
        "servers": names,
        "instances": cfg.instances,
        "single": {"rounds": one},
        "multi": {"rounds": many, "streams": cfg.streams},
    }
    for name in ("hearth", "hearth-nospec"):
        out["single"][f"{name}/llama-server decode"] = summary(ratios(one, name, "llama-server", _key("decode_tps")))
        out["single"][f"{name}/llama-server e2e"] = summary(ratios(one, name, "llama-server", _key("e2e_tps")))
        out["multi"][f"{name}/llama-server"] = summary(ratios(many, name, "llama-server", _key("aggregate_tps")))
    return out


async def _decode_rounds(variants: list[Variant], names: list[str], s: Settings, cfg: AbConfig,
                         log: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One set of fresh servers (started in `variants`' order): `cfg.rounds` single-stream
    rounds, then as many rounds of `cfg.streams` streams."""
    async with started(variants, s, log) as members, _client(s) as client:

        async def single(name: str, r: int) -> dict[str, Any]:
            body = chat_body([{"role": "user", "content": f"[d1-{r}] {STORY}"}], cfg.max_tokens, ignore_eos=True)
            return _stream_record(await stream_chat(client, members[name].url, body))

        async def multi(name: str, r: int) -> dict[str, Any]:
            t0 = time.perf_counter()
            sts = await asyncio.gather(
                *(
                    stream_chat(
                        client,
                        members[name].url,
                        chat_body(
                            [{"role": "user", "content": f"[d{cfg.streams}-{r}-{k}] {STORY}"}],
                            cfg.max_tokens,
                            ignore_eos=True,
                        ),
                    )
                    for k in range(cfg.streams)
                )
            )
            done = [st for st in sts if st.token_times and not st.error]
            last = max((st.token_times[-1] for st in done), default=t0)
            total = sum(st.n_tokens for st in done)
            return {
                "aggregate_tps": total / (last - t0) if last > t0 else None,
                "n_tokens": total,
                "errors": [st.error for st in sts if st.error],
            }

        log(f"decode: {cfg.rounds} single-stream rounds")
        one = await alternate(names, cfg.rounds, single, members)
        log(f"decode: {cfg.rounds} rounds of {cfg.streams} streams")
        return one, await alternate(names, cfg.rounds, multi, members)


# Answer lengths the churn clients cycle through (fixed, so every server gets the same requests).
CHURN_LENGTHS = (37, 90, 23, 64, 120, 45, 15, 80, 30, 100, 55, 70)


async def churn(s: Settings, cfg: AbConfig, log: Any) -> dict[str, Any]:
    """Decode under churn: `cfg.churn_clients` clients (one fewer than the slots by default),
    each sending non-streamed chats back to back whose answers end at different lengths
    (CHURN_LENGTHS, ignore_eos), for `cfg.churn_seconds` per round; aggregate generated tok/s.
    Requests end at different times, so which slots run changes every few steps, and an idle
    slot between running ones is common: the shape of a busy server with real traffic, where
    the fixed-length `decode` section has every stream start and end together. Speculation off
    on both (it drafts little on this text; its own section measures it)."""
    variants = [HEARTH_NOSPEC, LLAMA]
    names = [v.name for v in variants]
    async with started(variants, s, log) as members, _client(s) as client:

        async def one_client(url: str, k: int, r: int, until: float, counts: list[int]) -> None:
            i = k
            while time.monotonic() < until:
                n = CHURN_LENGTHS[i % len(CHURN_LENGTHS)]
                body = chat_body([{"role": "user", "content": f"[c{r}-{k}-{i}] {STORY}"}], n, ignore_eos=True)
                body["stream"] = False
                resp = await client.post(url + "/v1/chat/completions", json=body)
                resp.raise_for_status()
                counts.append(int(resp.json()["usage"]["completion_tokens"]))
                i += cfg.churn_clients

        async def measure(name: str, r: int) -> dict[str, Any]:
            counts: list[int] = []
            t0 = time.monotonic()
            await asyncio.gather(*(one_client(members[name].url, k, r, t0 + cfg.churn_seconds, counts)
                                   for k in range(cfg.churn_clients)))
            wall = time.monotonic() - t0
            return {"aggregate_tps": sum(counts) / wall, "requests": len(counts), "wall_s": round(wall, 2)}

        log(f"churn: {cfg.rounds} rounds of {cfg.churn_clients} clients x {cfg.churn_seconds:g} s")
        rounds = await alternate(names, cfg.rounds, measure, members)
    return {"servers": names, "clients": cfg.churn_clients, "slots": s.parallel, "seconds": cfg.churn_seconds,
            "rounds": rounds,
            "hearth-nospec/llama-server": summary(ratios(rounds, "hearth-nospec", "llama-server",
                                                         _key("aggregate_tps")))}


async def _hearth_spec_counts(client: httpx.AsyncClient, m: Member) -> tuple[float, float]:
    got = await metrics(client, m.url)
    return got.get("hearth_spec_drafted_tokens_total", 0.0), got.get("hearth_spec_accepted_tokens_total", 0.0)


async def speculative(s: Settings, cfg: AbConfig, log: Any) -> dict[str, Any]:
    """Agent workloads at temperature 0: Hearth with and without its prompt-lookup drafts,
    llama-server with its defaults (no speculation) and with each of its n-gram modes."""
    variants = [
        HEARTH,
        HEARTH_NOSPEC,
        LLAMA,
        *(Variant(f"llama-server-{mode}", "llama-server", ("--spec-type", mode)) for mode in NGRAM_MODES),
    ]
    if cfg.spec_servers is not None:
        unknown = set(cfg.spec_servers) - {v.name for v in variants}
        if unknown:
            raise SystemExit(f"unknown spec server(s): {', '.join(sorted(unknown))}")
        variants = [v for v in variants if v.name == "hearth" or v.name in cfg.spec_servers]
    names = [v.name for v in variants]
    out: dict[str, Any] = {"servers": names, "workloads": {}}
    async with started(variants, s, log) as members, _client(s) as client:
        for workload in cfg.spec_workloads or list(agent_workloads("x")):

            async def one(name: str, r: int, workload: str = workload) -> dict[str, Any]:
                m = members[name]
                body = chat_body(agent_workloads(f"s{r}")[workload], cfg.spec_max_tokens, ignore_eos=False)
                before = await _hearth_spec_counts(client, m) if m.variant.kind == "hearth" else None
                st = await stream_chat(client, m.url, body)
                rec = _stream_record(st)
                rec["text_sha"] = hashlib.sha256(st.text.encode()).hexdigest()[:12]
                if before is not None:
                    after = await _hearth_spec_counts(client, m)
                    rec["drafted"], rec["accepted"] = after[0] - before[0], after[1] - before[1]
                elif "draft_n" in st.timings:
                    rec["drafted"], rec["accepted"] = st.timings["draft_n"], st.timings.get("draft_n_accepted", 0)
                return rec

            log(f"speculative: {workload}, {cfg.spec_rounds} rounds over {len(names)} servers")
            rounds = await alternate(names, cfg.spec_rounds, one, members)
            w: dict[str, Any] = {"rounds": rounds, "speedup": {}, "acceptance": {}}
            for name in names:
                drafted = sum(r[name]["value"].get("drafted") or 0 for r in rounds)
                accepted = sum(r[name]["value"].get("accepted") or 0 for r in rounds)
                w["acceptance"][name] = accepted / drafted if drafted else None
                if name != "hearth":
                    w["speedup"][f"hearth/{name}"] = summary(ratios(rounds, "hearth", name, _key("decode_tps")))
            w["drafted"] = {n: sum(r[n]["value"].get("drafted") or 0 for r in rounds) for n in names}
            w["generated"] = {n: sum(r[n]["value"].get("n_tokens") or 0 for r in rounds) for n in names}
            ngram = [n for n in names if n.startswith("llama-server-")]
            w["best_llama_ngram"] = max(
                ngram, key=lambda n: summary([r[n]["value"]["decode_tps"] or 0 for r in rounds])["median"] or 0,
            ) if ngram else None
            out["workloads"][workload] = w
    return out


async def _kv_bytes_per_token(client: httpx.AsyncClient, m: Member, tokens: int) -> dict[str, Any]:
    """A session of about `tokens` tokens, saved: kv.bin bytes / session tokens (real bytes)."""
    sid = f"kvbytes-{m.variant.name}"
    words = " ".join(["the keeper climbed the stairs of the lighthouse"] * max(1, tokens // 9))
    r = await client.post(
        f"{m.url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": words}],
            "max_tokens": 1,
            "temperature": 0,
            "session_id": sid,
        },
    )
    r.raise_for_status()
    snap = (await client.post(f"{m.url}/v1/sessions/{sid}/save", json={})).json()
    assert m.data_dir is not None
    kv = (m.data_dir / "snapshots" / snap["snapshot_id"] / "kv.bin").stat().st_size
    n = int(snap["session"]["n_tokens"])
    return {"session_tokens": n, "kv_bytes": kv, "bytes_per_token": kv / n}


async def kv_types(s: Settings, cfg: AbConfig, log: Any) -> dict[str, Any]:
    """Bytes per token and sessions per GiB for each KV type, how often greedy output keeps the
    f16 tokens, and single-stream decode speed alternated between the three."""
    variants = [Variant(f"hearth-{t}", "hearth", ("--kv-type", t)) for t in ("f16", "q8_0", "q4_0")]
    names = [v.name for v in variants]
    out: dict[str, Any] = {"servers": names, "types": {}}
    async with started(variants, s, log) as members, _client(s) as client:
        texts: dict[str, list[str]] = {n: [] for n in names}
        for i, prompt in enumerate(KV_PROMPTS[: cfg.kv_prompts]):
            for n in names:
                st = await stream_chat(
                    client,
                    members[n].url,
                    chat_body(
                        [{"role": "user", "content": prompt}], cfg.kv_max_tokens, ignore_eos=True, speculative=False
                    ),
                )
                texts[n].append(st.text)
            log(f"kv: prompt {i + 1}/{cfg.kv_prompts}")

        async def toks(text: str) -> list[int]:
            r = await client.post(f"{members['hearth-f16'].url}/tokenize", json={"content": text})
            return [int(t) for t in r.json()["tokens"]]

        async def single(name: str, r: int) -> dict[str, Any]:
            body = chat_body([{"role": "user", "content": f"[kv-{r}] {STORY}"}], 96, ignore_eos=True, speculative=False)
            return _stream_record(await stream_chat(client, members[name].url, body))

        speed = await alternate(names, cfg.kv_rounds, single, members)
        for n in names:
            info = await _kv_bytes_per_token(client, members[n], 1000)
            info["sessions_per_gib"] = (1 << 30) / (info["bytes_per_token"] * cfg.session_tokens)
            same = total = prefix = 0
            for ref, got in zip(texts["hearth-f16"], texts[n], strict=True):
                a, b = await toks(ref), await toks(got)
                total += max(len(a), len(b))
                same += sum(x == y for x, y in zip(a, b, strict=False))
                k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                prefix += k
            info["identical_token_fraction"] = same / total if total else None
            info["identical_prefix_fraction"] = prefix / total if total else None
            info["decode_vs_f16"] = summary(ratios(speed, n, "hearth-f16", _key("decode_tps")))
            out["types"][n.removeprefix("hearth-")] = info
        out["speed_rounds"] = speed
        out["session_tokens_assumed"] = cfg.session_tokens
    return out
