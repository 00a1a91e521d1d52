"""Sequential single requests: TTFT, time per output token, single-stream tokens/s."""

from __future__ import annotations

from bench.stats import summarize
from bench.workloads.base import WorkloadContext, WorkloadResult, check_streams, stream_record


class SingleStream:
    name = "single_stream"

    async def run(self, ctx: WorkloadContext) -> WorkloadResult:
        out = WorkloadResult()
        results = []
        cpu = []
        for i in range(ctx.settings.runs):
            streams, usage = await ctx.round(f"single-{i}", 1)
            results.extend(streams)
            cpu.append(usage)
            if usage["contaminated"]:
                out.warnings.append("a run stayed contaminated by other processes' CPU use after retries")
        good = check_streams(results, ctx.settings.max_tokens, out)
        ttft = [r.ttft * 1000 for r in good if r.ttft is not None]
        tpot = [r.tpot * 1000 for r in good if r.tpot is not None]
        tps = [r.tokens_per_s for r in good if r.tokens_per_s is not None]
        out.metrics["ttft_ms"] = summarize(ttft, "ms", higher_is_better=False)
        out.metrics["tpot_ms"] = summarize(tpot, "ms", higher_is_better=False)
        out.metrics["single_stream_tps"] = summarize(tps, "tok/s", higher_is_better=True)
        out.raw["streams"] = [stream_record(r) | {"cpu": u} for r, u in zip(results, cpu, strict=True)]
        return out
