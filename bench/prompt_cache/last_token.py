"""`python -m bench.prompt_cache.last_token`: what the last prompt token's decode costs over a
restored prefix (issue 38 item 4: after the restore, the first answer still needs the logits of
the prompt's last position: one decode over every cached position).

    .venv/bin/python -m bench.prompt_cache.last_token --tokens 11520 --rounds 6

One process loads the model (qwen2.5-coder-0.5b unless `--model`) once per KV type
(`--kv-types`, default f16 and q8_0: Hearth's `--kv-type`), two sequences each; restores
`--tokens` positions of synthetic KV into sequence 0 and one block (256) into sequence 1 through
`Runner.state_set_blocks` (random values of the right type: the time of attention does not
depend on them), then times, alternated round by round, one decode with logits at the end of
each: the long prefix's (what a restart's first answer pays for Claude Code's prompt) and the
short one's (the plain per-token cost). Prints the medians and the KV bytes per token.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

BLOCK = 256


def synthetic(n_bytes: int, kv_type: str, rng: np.random.Generator) -> bytes:
    if kv_type == "f16":
        return (rng.standard_normal(n_bytes // 2) * 0.5).astype("<f2").tobytes()
    if kv_type == "q8_0":  # blocks of a f16 scale and 32 int8
        raw = rng.integers(-64, 64, n_bytes, dtype=np.int8).view(np.uint8).reshape(-1, 34)
        raw[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
        return raw.tobytes()
    raise ValueError(kv_type)


def main(argv: list[str] | None = None) -> None:
    from bench.agents import default_model
    from hearth.backends.llamacpp.runner import LlamaCppRunner
    from hearth.engine.runner import BatchEntry

    ap = argparse.ArgumentParser(prog="python -m bench.prompt_cache.last_token", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=11520)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--kv-types", default="f16,q8_0")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    model = a.model or default_model()
    rng = np.random.default_rng(0)
    runners = {}
    seq_ctx = -(-(a.tokens + BLOCK) // BLOCK) * BLOCK
    for kv in a.kv_types.split(","):
        r = LlamaCppRunner(model, seq_ctx=seq_ctx, n_seq_max=2, n_threads=a.threads, kv_type=kv)
        per_token = r._layout().per_token
        for seq, n in ((0, a.tokens), (1, BLOCK)):
            parts = [(synthetic(min(BLOCK, n - s) * per_token, kv, rng), min(BLOCK, n - s), min(BLOCK, n - s))
                     for s in range(0, n, BLOCK)]
            r.state_set_blocks(seq, parts)
        runners[kv] = (r, per_token)
    times: dict[tuple[str, int], list[float]] = {(kv, n): [] for kv in runners for n in (a.tokens, BLOCK)}
    first: dict[str, float] = {}
    for kv, (r, _) in runners.items():  # the first decode with logits in each context (a fresh process's)
        t = time.perf_counter()
        r.decode([BatchEntry(0, [100], a.tokens, 1)])
        r.logits(0)
        first[kv] = time.perf_counter() - t
        r.kv_remove(0, a.tokens, -1)
    for rnd in range(a.rounds):
        order = list(runners) if rnd % 2 == 0 else list(runners)[::-1]
        for kv in order:
            r = runners[kv][0]
            for seq, n in ((0, a.tokens), (1, BLOCK)):
                t = time.perf_counter()
                r.decode([BatchEntry(seq, [100], n, 1)])
                r.logits(0)
                times[(kv, n)].append(time.perf_counter() - t)
                r.kv_remove(seq, n, -1)
    for kv, (_, per_token) in runners.items():
        long, short = statistics.median(times[(kv, a.tokens)]), statistics.median(times[(kv, BLOCK)])
        print(f"{kv:5s}: one decode after {a.tokens} positions {long * 1000:6.1f} ms (the context's first: "
              f"{first[kv] * 1000:.1f} ms), after {BLOCK} "
              f"{short * 1000:5.1f} ms; KV {per_token} B/token, {per_token * a.tokens / 1e6:.1f} MB for the prefix")
    for r, _ in runners.values():
        r.close()


if __name__ == "__main__":
    main()
