"""Cancel latency: how fast a server stops generating once the client cancels, and how many tokens
it still generates after that, in the decode phase and in the middle of a long prefill.

Methods (one request in flight at a time, so server-wide counters belong to that request):

- `cancel` (Hearth only): the request carries a unique `cancel_id`; the client sends
  `POST /v1/cancel {"cancel_id": ...}` and keeps reading. Latency = cancel POST sent -> arrival
  of the chunk with `finish_reason` (Hearth sends "cancelled"), or end of stream if none came.
- `disconnect` (Hearth and llama-server): the client closes the connection. Latency = connection
  closed -> first `/metrics` poll (every `cancel_poll_ms`) showing the server idle: Hearth
  `hearth_running_sequences + hearth_waiting_requests == 0`, llama-server
  `llamacpp:requests_processing + llamacpp:requests_deferred == 0`. The poll interval and the
  poll's own round trip are included (an upper bound). Polls every `cancel_poll_ms` (3 ms) for
  250 ms, then every 25 ms (each poll costs the server CPU).

Phases:

- `decode` (`--cancel-runs` times): short prompt; trigger once `cancel_after_tokens` content
  chunks arrived.
- `prefill` (`--cancel-prefill-runs` times): a ~`cancel_prompt_tokens` prompt (capped to fit
  `--ctx`); trigger 100-300 ms (spread deterministically, the same delays for every server)
  after sending, while the prompt is still being processed (the run records whether a token had already arrived).

Tokens after the cancel (`*_tokens_after`), from server counters:

- decode: counter read right before the trigger vs. when idle. Hearth
  `hearth_generated_tokens_total`; llama-server `llamacpp:n_decode_total` (llama_decode calls: with
  one sequence decoding, one call = one sampled token; its `tokens_predicted_total` is only added
  when the slot is released, so it cannot be read mid-request). Strict: a token generated between
  the /metrics read and the trigger (a few ms) counts as "after", delivered or not.
- prefill: all tokens the request generated (Hearth `hearth_generated_tokens_total`, llama-server
  `llamacpp:tokens_predicted_total`, both from before the request to idle) minus content tokens the
  client had before the trigger (normally 0). No read before the trigger: llama-server answers
  /metrics only between two llama_decode calls, so a read would wait for the prefill batch.

For `cancel` the raw record also has `client_tokens_after` (content chunks read after the cancel
POST was sent; chunks already buffered count as after) and `undelivered` (tokens the counter saw
but the client never received).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.client import _handle_event
from bench.stats import summarize
from bench.workloads.base import WorkloadContext, WorkloadResult

_TEXT = (
    "the lighthouse keeper walked along the rocky shore at dawn while gulls circled above the grey "
    "water and the wind carried salt spray over the old stone wall near the harbour where fishing "
    "boats rocked gently against their ropes and a bell rang somewhere beyond the fog bank"
)
WORDS = _TEXT.split(" ")

# Which counters mean what, per server (sums over label sets).
HEARTH: dict[str, Any] = {
    "busy": ("hearth_running_sequences", "hearth_waiting_requests"),
    "live": "hearth_generated_tokens_total",
    "final": "hearth_generated_tokens_total",
}
LLAMA_SERVER: dict[str, Any] = {
    "busy": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    "live": "llamacpp:n_decode_total",
    "final": "llamacpp:tokens_predicted_total",
}
PROBES = {"hearth": HEARTH, "llama-server": LLAMA_SERVER}
METHODS = {"hearth": ("cancel", "disconnect"), "llama-server": ("disconnect",)}
PHASES = ("decode", "prefill")
TARGET_P99_MS = 50.0
SLOW_POLL_AFTER_S = 0.25
SLOW_POLL_S = 0.025
IDLE_TIMEOUT_S = 180.0  # llama-server finishes a whole long prompt before it notices a disconnect
TRIGGER_TIMEOUT_S = 15.0  # decode phase: give up an attempt whose first tokens take longer
TARGET_TOKENS_AFTER = 1


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets (enough for single-model servers)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


@dataclass
class Stream:
    """One streamed request read in a task; `content_times` are perf_counter arrivals."""

    t_send: float
    content_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    t_finish: float | None = None  # arrival of the chunk carrying finish_reason
    t_eof: float | None = None
    usage_tokens: int | None = None
    error: str | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class CancelLatency:
    name = "cancel"

    async def run(self, ctx: WorkloadContext) -> WorkloadResult:
        out = WorkloadResult()
        s = ctx.settings
        probe = PROBES.get(ctx.server_name)
        if probe is None:
            out.raw["skipped"] = f"{ctx.server_name}: no cancel endpoint and no server-side token counters"
            return out
        control = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0))
        try:
            try:
                counters = await self._counters(control, ctx)
            except (httpx.HTTPError, ValueError) as exc:
                out.errors.append(f"GET /metrics failed: {exc}")
                return out
            names: list[str] = [*probe["busy"], probe["live"], probe["final"]]
            missing = [n for n in names if n not in counters]
            if missing:
                out.errors.append(f"/metrics lacks {', '.join(missing)}")
                return out
            prompt_words, prompt_info = self._long_prompt(ctx)
            out.raw["long_prompt"] = prompt_info  # calibration below adds its TTFT
            if prompt_info.get("capped"):
                out.warnings.append(
                    f"prefill prompt capped to {prompt_info['target_tokens']} tokens to fit ctx {s.ctx}"
                )
            # Full prefill once: warms up long prompts and tells whether 100-300 ms is mid-prefill.
            cal = await self._calibrate(ctx, prompt_words)
            prompt_info.update(cal)
            if cal.get("ttft_ms") is not None and cal["ttft_ms"] < s.cancel_delay_ms[1] * 1.5:
                out.warnings.append(
                    f"long-prompt TTFT {cal['ttft_ms']:.0f} ms: prefill-phase cancels may land after prefill"
                )
            for method in METHODS[ctx.server_name]:
                for phase in PHASES:
                    key = f"{method}_{phase}"
                    records: list[dict[str, Any]] = []
                    n_runs = s.cancel_runs if phase == "decode" else s.cancel_prefill_runs
                    for i in range(n_runs):

                        async def attempt(
                            a: int, i: int = i, method: str = method, phase: str = phase
                        ) -> dict[str, Any]:
                            return await self._one(ctx, control, probe, method, phase, i, a, prompt_words)

                        rec, usage = await ctx.measure(attempt, wait_s=s.cancel_retry_wait_s)
                        rec["cpu"] = usage
                        records.append(rec)
                        if rec.get("error"):
                            out.errors.append(f"{key}[{i}]: {rec['error']}")
                    self._summarize(out, key, records)
                    out.raw[key] = records
        finally:
            await control.aclose()
        return out

    # ---- one measurement ---------------------------------------------------------------------

    async def _one(
        self,
        ctx: WorkloadContext,
        control: httpx.AsyncClient,
        probe: dict[str, Any],
        method: str,
        phase: str,
        i: int,
        attempt: int,
        prompt_words: list[str],
    ) -> dict[str, Any]:
        s = ctx.settings
        tag = f"{method}-{phase}-{i}-a{attempt}"
        rec: dict[str, Any] = {"i": i, "method": method, "phase": phase}
        idle, c_start, _ = await self._wait_idle(control, ctx, probe, timeout_s=60.0)
        if not idle:
            rec["error"] = "server not idle before the request"
            return rec
        if phase == "decode":
            spec = ctx.request(tag, max_tokens=max(64, min(1024, s.ctx - 256)))
        else:
            spec = ctx.request(tag, max_tokens=64)
            spec.prompt = f"[{tag}] " + " ".join(prompt_words)
        body = spec.body()
        cancel_id = f"bench-{tag}-{uuid.uuid4().hex[:12]}"
        if method == "cancel":
            body["cancel_id"] = cancel_id
        st = Stream(t_send=time.perf_counter())
        reader = asyncio.create_task(self._read(ctx, body, st, s.cancel_after_tokens if phase == "decode" else None))
        c_pre: dict[str, float] | None = None
        if phase == "decode":
            waiter = asyncio.create_task(st.ready.wait())
            await asyncio.wait({reader, waiter}, timeout=TRIGGER_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not st.ready.is_set():
                # Normally ~0.3 s; tens of seconds only when other processes starve the server's
                # spinning threads. Give up this attempt (measure() re-runs it if CPU was shared).
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                await self._wait_idle(control, ctx, probe, timeout_s=IDLE_TIMEOUT_S)
                rec["error"] = (
                    f"no {s.cancel_after_tokens} tokens within {TRIGGER_TIMEOUT_S:.0f} s ({st.error or 'timeout'})"
                )
                return rec
            c_pre = await self._counters(control, ctx)
        else:
            lo, hi = s.cancel_delay_ms
            delay = (lo + (hi - lo) * ((i * 0.6180339887) % 1.0)) / 1000.0
            rec["delay_ms"] = round(delay * 1000, 1)
            await asyncio.sleep(max(0.0, st.t_send + delay - time.perf_counter()))
        n_before = len(st.content_times)
        t_trigger = time.perf_counter()
        rec["trigger_after_send_ms"] = round((t_trigger - st.t_send) * 1000, 2)
        rec["client_tokens_before"] = n_before
        if method == "cancel":
            try:
                resp = await control.post(f"{ctx.base_url}/v1/cancel", json={"cancel_id": cancel_id})
                rec["cancel_response"] = resp.json() if resp.status_code == 200 else f"HTTP {resp.status_code}"
            except (httpx.HTTPError, ValueError) as exc:
                rec["cancel_response"] = f"{type(exc).__name__}: {exc}"
            try:
                await asyncio.wait_for(asyncio.shield(reader), timeout=60.0)
            except TimeoutError:
                reader.cancel()
                rec["error"] = "stream did not end within 60 s of the cancel"
            t_end = st.t_finish if st.t_finish is not None else st.t_eof
            rec["finish_reason"] = st.finish_reason
            rec["latency_ms"] = round((t_end - t_trigger) * 1000, 3) if t_end is not None else None
            rec["eof_ms"] = round((st.t_eof - t_trigger) * 1000, 3) if st.t_eof is not None else None
            rec["client_tokens_after"] = sum(1 for t in st.content_times if t > t_trigger)
            idle, c_end, t_idle = await self._wait_idle(control, ctx, probe, timeout_s=IDLE_TIMEOUT_S)
            rec["idle_ms"] = round((t_idle - t_trigger) * 1000, 3) if idle else None
        else:
            reader.cancel()  # closes the connection (httpx drops a connection whose body was not read)
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            idle, c_end, t_idle = await self._wait_idle(control, ctx, probe, timeout_s=IDLE_TIMEOUT_S)
            rec["latency_ms"] = round((t_idle - t_trigger) * 1000, 3) if idle else None
        if not idle:
            rec["error"] = (rec.get("error") or "") + f" server still busy {IDLE_TIMEOUT_S:.0f} s after the trigger"
            return rec
        c_end = await self._counters(control, ctx)  # one more read, after the server went idle
        total_final = c_end[probe["final"]] - c_start[probe["final"]]
        total_live = c_end[probe["live"]] - c_start[probe["live"]]
        rec["server_tokens_total"] = total_final
        rec["server_live_total"] = total_live
        rec["client_tokens_total"] = len(st.content_times)
        rec["usage_tokens"] = st.usage_tokens
        if c_pre is not None:
            rec["tokens_after"] = c_end[probe["live"]] - c_pre[probe["live"]]
        else:
            rec["tokens_after"] = total_final - n_before
        rec["prefill_done_before_trigger"] = n_before > 0
        if method == "cancel":
            delivered = st.usage_tokens if st.usage_tokens is not None else len(st.content_times)
            rec["undelivered"] = total_final - delivered
        if st.error and method == "cancel":
            rec["stream_error"] = st.error
        return rec

    async def _read(self, ctx: WorkloadContext, body: dict[str, Any], st: Stream, ready_after: int | None) -> None:
        """Stream one request into `st`; cancelling this task closes the connection."""
        try:
            async with ctx.client.stream("POST", f"{ctx.base_url}/v1/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    st.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = time.perf_counter()
                    had_finish = st.finish_reason is not None
                    n = len(st.content_times)
                    holder = _Holder()
                    _handle_event(data, holder, now)  # type: ignore[arg-type]
                    st.content_times.extend(holder.token_times)
                    if holder.usage_tokens is not None:
                        st.usage_tokens = holder.usage_tokens
                    if holder.finish_reason and not had_finish:
                        st.finish_reason, st.t_finish = holder.finish_reason, now
                    if ready_after is not None and n < ready_after <= len(st.content_times):
                        st.ready.set()
        except (httpx.HTTPError, ValueError) as exc:
            st.error = f"{type(exc).__name__}: {exc}"
        finally:
            st.t_eof = time.perf_counter()

    # ---- server state --------------------------------------------------------------------------

    async def _counters(self, control: httpx.AsyncClient, ctx: WorkloadContext) -> dict[str, float]:
        resp = await control.get(f"{ctx.base_url}/metrics")
        resp.raise_for_status()
        return parse_prometheus(resp.text)

    async def _wait_idle(
        self, control: httpx.AsyncClient, ctx: WorkloadContext, probe: dict[str, Any], timeout_s: float
    ) -> tuple[bool, dict[str, float], float]:
        """Poll /metrics every `cancel_poll_ms` until nothing runs or waits; (idle, counters, time)."""
        start = time.perf_counter()
        deadline = start + timeout_s
        fast = ctx.settings.cancel_poll_ms / 1000.0
        while True:
            c = await self._counters(control, ctx)
            now = time.perf_counter()
            if sum(c.get(n, 0.0) for n in probe["busy"]) == 0:
                return True, c, now
            if now > deadline:
                return False, c, now
            # Every poll costs the server CPU on a 2-core machine (llama-server answers it from its main
            # loop): poll fast for the first 250 ms, then every 25 ms (under 2 % error at > 1 s).
            await asyncio.sleep(fast if now - start < SLOW_POLL_AFTER_S else SLOW_POLL_S)

    # ---- prompt and calibration -----------------------------------------------------------------

    def _long_prompt(self, ctx: WorkloadContext) -> tuple[list[str], dict[str, Any]]:
        """Words for a prompt of ~cancel_prompt_tokens tokens (capped so prompt + 64 + template fit ctx)."""
        s = ctx.settings
        target = min(s.cancel_prompt_tokens, s.ctx - 64 - 96)
        info: dict[str, Any] = {"target_tokens": target, "capped": target < s.cancel_prompt_tokens}
        words = [WORDS[k % len(WORDS)] for k in range(target)]
        try:
            import llama_cpp  # the same vocabulary every server uses

            vocab = llama_cpp.Llama(model_path=str(s.model), vocab_only=True, verbose=False)
            n = len(vocab.tokenize(" ".join(words).encode(), add_bos=False))
            words = words[: max(1, int(len(words) * target / n))]
            info["prompt_tokens"] = len(vocab.tokenize(" ".join(words).encode(), add_bos=False))
            info["counted_with"] = "llama_cpp vocab_only"
        except Exception as exc:  # no tokenizer: ~1 token per word for this text
            info["counted_with"] = f"estimate (1 token/word): {type(exc).__name__}"
            info["prompt_tokens"] = len(words)
        return words, info

    async def _calibrate(self, ctx: WorkloadContext, words: list[str]) -> dict[str, Any]:
        tag = f"calibrate-{uuid.uuid4().hex[:8]}"
        spec = ctx.request(tag, max_tokens=1)
        spec.prompt = f"[{tag}] " + " ".join(words)
        st = Stream(t_send=time.perf_counter())
        await self._read(ctx, spec.body(), st, None)
        ttft = (st.content_times[0] - st.t_send) * 1000 if st.content_times else None
        return {"ttft_ms": ttft, "calibration_error": st.error}

    # ---- summaries ------------------------------------------------------------------------------

    def _summarize(self, out: WorkloadResult, key: str, records: list[dict[str, Any]]) -> None:
        good = [r for r in records if not r.get("error") and r.get("latency_ms") is not None]
        clean = [r for r in good if not r["cpu"]["contaminated"]]
        lat = summarize([r["latency_ms"] for r in good], "ms", higher_is_better=False)
        tok = summarize([float(r["tokens_after"]) for r in good], "tokens", higher_is_better=False)
        lat["p99_clean"] = _p99([r["latency_ms"] for r in clean])
        for m in (lat, tok):
            m.update(
                table="cancel",
                runs=len(records),
                failed=len(records) - len(good),
                contaminated=sum(1 for r in good if r["cpu"]["contaminated"]),
            )
        p99, worst = lat["p99"], tok["max"]
        lat["target_met"] = isinstance(p99, float) and p99 < TARGET_P99_MS
        tok["target_met"] = isinstance(worst, float) and worst <= TARGET_TOKENS_AFTER
        if key.endswith("prefill"):
            lat["prefill_done_before_trigger"] = sum(1 for r in good if r["prefill_done_before_trigger"])
        out.metrics[f"{key}_latency_ms"] = lat
        out.metrics[f"{key}_tokens_after"] = tok
        if key.startswith("cancel"):
            idle = [r["idle_ms"] for r in good if r.get("idle_ms") is not None]
            out.metrics[f"{key}_idle_ms"] = summarize(idle, "ms", higher_is_better=False) | {"table": "cancel"}
            client_after = [float(r["client_tokens_after"]) for r in good]
            out.metrics[f"{key}_client_tokens_after"] = summarize(client_after, "tokens", higher_is_better=False) | {
                "table": "cancel"
            }
            reasons = sorted({str(r.get("finish_reason")) for r in good})
            lat["finish_reasons"] = reasons


@dataclass
class _Holder:
    """Duck-typed StreamResult for bench.client._handle_event (one event at a time)."""

    token_times: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    finish_reason: str | None = None
    text_chars: int = 0


def _p99(values: list[float]) -> float | None:
    from bench.stats import percentile

    return percentile(values, 99)
