"""Cancel during a long prefill, in Hearth: alone, and sharing its batch with a running stream
(whose greedy text is checked against its uninterrupted run). llama-server, which finishes a
prompt before it notices a disconnect, is measured on a few disconnects for contrast.

Per run: a ~`prompt_tokens` prompt is sent; 100-300 ms later (deterministic spread) the client
cancels it: `POST /v1/cancel` (latency: until the chunk with finish_reason arrives) or closes
the connection (latency: until /metrics shows the slot free, polled every 3 ms). Tokens after:
what the request generated (usage, or the server's counter) minus what the client had when it
cancelled. A run also records whether its decode was interrupted midway (Hearth's counter)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx

from bench.ab.client import Stream, chat_body, metrics, stream_chat
from bench.ab.group import Member, Variant, started
from bench.ab.texts import STORY
from bench.config import Settings
from bench.stats import percentile

WORDS = [
    "the",
    "keeper",
    "climbed",
    "the",
    "stairs",
    "of",
    "the",
    "old",
    "lighthouse",
    "at",
    "dusk",
    "while",
    "the",
    "gulls",
    "circled",
]


def _delay(i: int) -> float:
    return 0.1 + 0.2 * ((i * 7) % 11) / 10


async def _long_prompt(client: httpx.AsyncClient, m: Member, tokens: int) -> str:
    words = [WORDS[k % len(WORDS)] for k in range(tokens)]
    r = await client.post(f"{m.url}/tokenize", json={"content": " ".join(words)})
    n = int(r.json()["count"])
    return " ".join(words[: max(1, len(words) * tokens // n)])


async def _wait_idle(
    client: httpx.AsyncClient, m: Member, busy: tuple[str, ...], want: float, timeout: float = 300.0
) -> float:
    """Seconds until the busy gauges sum to `want` (polled every 3 ms)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        got = await metrics(client, m.url)
        if sum(got.get(b, 0.0) for b in busy) <= want:
            return time.perf_counter() - t0
        await asyncio.sleep(0.003)
    raise TimeoutError("the server did not go idle")


HEARTH_BUSY = ("hearth_running_sequences", "hearth_waiting_requests")
LLAMA_BUSY = ("llamacpp:requests_processing", "llamacpp:requests_deferred")


async def _one(
    client: httpx.AsyncClient, m: Member, prompt: str, i: int, method: str, neighbour: dict[str, Any] | None
) -> dict[str, Any]:
    hearth = m.variant.kind == "hearth"
    busy = HEARTH_BUSY if hearth else LLAMA_BUSY
    await _wait_idle(client, m, busy, 0)
    before = await metrics(client, m.url)
    n_task = None
    if neighbour is not None:  # a running stream that shares the batch with the prefill
        started_ev = asyncio.Event()

        def on_chunk(st: Stream) -> None:
            if len(st.token_times) >= 3:
                started_ev.set()

        n_task = asyncio.ensure_future(stream_chat(client, m.url, neighbour["body"], on_chunk))
        await asyncio.wait_for(started_ev.wait(), 120)
    cancel_id = f"ab-cancel-{i}-{time.monotonic_ns()}"
    body = chat_body([{"role": "user", "content": f"[c{i}] {prompt}"}], 32, ignore_eos=True, cancel_id=cancel_id)
    rec: dict[str, Any] = {"i": i, "method": method, "shared": neighbour is not None, "delay_s": _delay(i)}
    progress = [0]
    task = asyncio.ensure_future(
        stream_chat(client, m.url, body, lambda st: progress.__setitem__(0, len(st.token_times)))
    )
    await asyncio.sleep(_delay(i))
    seen = progress[0]  # content chunks the client had when it cancelled (0 when it lands mid-prefill)
    rec["tokens_before"] = seen
    t_cancel = time.perf_counter()
    if method == "cancel":
        await client.post(f"{m.url}/v1/cancel", json={"cancel_id": cancel_id})
        st = await task
        rec["latency_s"] = st.t_end - t_cancel  # the finish chunk, usage and [DONE] arrive together
        rec["tokens_after"] = max(0, st.n_tokens - seen)
        rec["finish_reason"] = st.finish_reason
    else:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        want = 1 if n_task is not None else 0
        rec["latency_s"] = await _wait_idle(client, m, busy, want)
        after = await metrics(client, m.url)
        counter = "hearth_generated_tokens_total" if hearth else "llamacpp:tokens_predicted_total"
        if n_task is None:
            rec["tokens_after"] = after.get(counter, 0) - before.get(counter, 0) - seen
    if hearth:
        after = await metrics(client, m.url)
        rec["interrupted"] = after.get("hearth_interrupted_decodes_total", 0) > before.get(
            "hearth_interrupted_decodes_total", 0
        )
    if n_task is not None:
        nst = await n_task
        assert neighbour is not None
        rec["neighbour_identical"] = nst.text == neighbour["reference"]
    return rec


def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [1000 * r["latency_s"] for r in records]
    after = [r["tokens_after"] for r in records if r.get("tokens_after") is not None]
    out: dict[str, Any] = {
        "runs": len(records),
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else None,
        "tokens_after_mean": sum(after) / len(after) if after else None,
        "tokens_after_max": max(after) if after else None,
        "interrupted": sum(1 for r in records if r.get("interrupted")),
    }
    shared = [r for r in records if "neighbour_identical" in r]
    if shared:
        out["neighbour_identical"] = f"{sum(r['neighbour_identical'] for r in shared)}/{len(shared)}"
    return out


async def cancel_section(s: Settings, runs: int, peer_runs: int, prompt_tokens: int, log: Any) -> dict[str, Any]:
    variants = [Variant("hearth", "hearth")] + ([Variant("llama-server", "llama-server")] if peer_runs else [])
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "rows": {}}
    async with started(variants, s, log) as members, httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        h = members["hearth"]
        prompt = await _long_prompt(client, h, prompt_tokens)
        st = await stream_chat(client, h.url, chat_body([{"role": "user", "content": prompt}], 1, ignore_eos=True))
        out["full_prefill_ttft_s"] = st.ttft  # the cancels at 100-300 ms land well inside it
        nbody = chat_body([{"role": "user", "content": STORY}], 64, ignore_eos=True, cache_prompt=False)
        reference = (await stream_chat(client, h.url, nbody)).text
        plans = [
            ("hearth", "cancel", None),
            ("hearth", "disconnect", None),
            ("hearth", "cancel", {"body": nbody, "reference": reference}),
        ]
        if peer_runs:
            plans.append(("llama-server", "disconnect", None))
        for server, method, neighbour in plans:
            key = f"{server} {method}{' shared' if neighbour else ''}"
            n = peer_runs if server == "llama-server" else runs
            log(f"cancel: {key}, {n} runs")
            records = [await _one(client, members[server], prompt, i, method, neighbour) for i in range(n)]
            out["rows"][key] = {**_summary(records), "records": records}
    return out
