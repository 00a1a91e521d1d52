"""Sequential single requests: TTFT, time per output token, single-stream tokens/s."""

from __future__ import annotations

from bench.stats import summarize
from bench.workloads.base import WorkloadContext, WorkloadResult, check_streams, stream_record


class SingleStream:
    name = "single_stream"

    async def run(self, ctx: WorkloadContext) -> WorkloadResult:
        out = WorkloadResult()
        results = [await ctx.send(f"single-{i}") for i in range(ctx.settings.runs)]
        good = check_streams(results, ctx.settings.max_tokens, out)
        ttft = [r.ttft * 1000 for r in good if r.ttft is not None]
        tpot = [r.tpot * 1000 for r in good if r.tpot is not None]
        tps = [r.tokens_per_s for r in good if r.tokens_per_s is not None]
        out.metrics["ttft_ms"] = summarize(ttft, "ms", higher_is_better=False)
        out.metrics["tpot_ms"] = summarize(tpot, "ms", higher_is_better=False)
        out.metrics["single_stream_tps"] = summarize(tps, "tok/s", higher_is_better=True)
        out.raw["streams"] = [stream_record(r) for r in results]
        return out
