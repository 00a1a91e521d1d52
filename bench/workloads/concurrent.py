"""N simultaneous streams: aggregate tokens/s (all tokens / wall time) and per-stream TTFT under load."""

from __future__ import annotations

from bench.stats import summarize
from bench.workloads.base import WorkloadContext, WorkloadResult, check_streams, stream_record


class Concurrent:
    name = "concurrent"

    async def run(self, ctx: WorkloadContext) -> WorkloadResult:
        out = WorkloadResult()
        for c in ctx.settings.concurrency:
            aggregate: list[float] = []
            ttft: list[float] = []
            rounds: list[dict[str, object]] = []
            for rep in range(ctx.settings.runs):
                results, usage = await ctx.round(f"c{c}-r{rep}", c)
                if usage["contaminated"]:
                    out.warnings.append("a run stayed contaminated by other processes' CPU use after retries")
                good = check_streams(results, ctx.settings.max_tokens, out)
                if len(good) == c:
                    wall = max(r.token_times[-1] for r in good) - min(r.t_start for r in good)
                    aggregate.append(sum(r.n_tokens for r in good) / wall)
                    rounds.append({"wall_s": wall, "cpu": usage, "streams": [stream_record(r) for r in results]})
                else:
                    rounds.append({"wall_s": None, "cpu": usage, "streams": [stream_record(r) for r in results]})
                ttft.extend(r.ttft * 1000 for r in good if r.ttft is not None)
            out.metrics[f"aggregate_tps_c{c}"] = summarize(aggregate, "tok/s", higher_is_better=True)
            out.metrics[f"ttft_ms_c{c}"] = summarize(ttft, "ms", higher_is_better=False)
            out.raw[f"c{c}"] = rounds
        return out
