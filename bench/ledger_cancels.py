"""Accounting exactness of the usage ledger under cancels (issue 41): N streams (200 by default)
each stopped at a random, seeded point, half by the client leaving (the connection closed after
k tokens: `disconnect`), half by `POST /v1/cancel` after k tokens (the stream then read to its
end: `cancel_call`), 8 at a time, on one real server with the default model.

The client counts the tokens it received exactly (`logprobs: true`: one entry per token), whole
network reads at a time, and stops after the read in which its k-th token arrived. Two
checks, per stream and in total:
- ledger `generated_tokens` == tokens the client received + the ledger's `discarded_tokens`
  (those generated after the last delivery), for every stream;
- the sum of the ledger's `generated_tokens` == the engine's own count of tokens sampled over
  the run (`hearth_generated_tokens_total` on /metrics, before and after): nothing lost in the
  step an abort arrived in, nothing counted twice.
A disconnect whose last token was in flight (written by the server, still in the socket when
the client closed) is reported apart (`in_flight_at_close`): the ledger counts it delivered.

    flock /tmp/hearth-bench.lock .venv/bin/python -m bench.ledger_cancels --streams 200 --max-tokens 24 --seed 41
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.observability import start

RESULTS = Path(__file__).parent / "results"
PROMPT = "Tell me a long story about a fox who learns to sail."
_GENERATED = re.compile(r'^hearth_generated_tokens_total\{[^}]*\} ([0-9.e+]+)$', re.M)


@dataclass
class Stream:
    n: int
    mode: str  # disconnect | cancel_call
    stop_after: int  # tokens received before the stop
    answer_id: str = ""
    received: int = 0  # tokens the client got (logprobs entries)
    ledger_generated: int = -1
    ledger_discarded: int = -1
    ledger_cancelled: str | None = None


def generated_total(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return int(sum(float(v) for v in _GENERATED.findall(text)))


def run_one(url: str, s: Stream, max_tokens: int) -> Stream:
    body = {"messages": [{"role": "user", "content": f"{PROMPT} ({s.n})"}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "logprobs": True}
    cancelled = False
    buf = b""
    with httpx.Client(timeout=600) as client, client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        # Whole network reads: every event that reached the client before it stops is counted
        # (stopping inside a read would leave events it had already received uncounted).
        for data in r.iter_raw():
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                s.answer_id = s.answer_id or chunk.get("id", "")
                for choice in chunk.get("choices") or []:
                    s.received += len((choice.get("logprobs") or {}).get("content") or [])
            if s.received >= s.stop_after and not cancelled:
                if s.mode == "disconnect":
                    return s  # leaving the block closes the connection mid-stream
                cancelled = True  # cancel_call: ask, then read what still comes
                client.post(f"{url}/v1/cancel", json={"completion_id": s.answer_id}, timeout=60)
    return s


def ledger_rows(url: str, want: set[str], wait: float = 60.0) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + wait
    while True:
        rows = httpx.get(f"{url}/admin/usage", params={"limit": "100000"}, timeout=60).json()["data"]
        found = {r["request_id"]: r for r in rows if r["request_id"] in want}
        if len(found) == len(want) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "ledger_cancels.json")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    streams = [Stream(n, "disconnect" if n % 2 == 0 else "cancel_call", rng.randint(1, args.max_tokens - 8))
               for n in range(args.streams)]
    rng.shuffle(streams)
    with tempfile.TemporaryDirectory() as tmp:
        url, proc = start(Path(tmp) / "hearth", args.threads, args.concurrency, [], {})
        try:
            before = generated_total(url)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                done = list(pool.map(lambda s: run_one(url, s, args.max_tokens), streams))
            elapsed = time.perf_counter() - t0
            rows = ledger_rows(url, {s.answer_id for s in done})
            time.sleep(0.5)  # nothing else runs: the engine's counter is final once the rows are in
            after = generated_total(url)
        finally:
            proc.terminate()
            proc.wait(30)
        log = (Path(tmp) / "hearth" / "server.log").read_text(errors="replace")
        late = log.count("recorded before its run's last engine output came")
    for s in done:
        row = rows.get(s.answer_id)
        if row is not None:
            s.ledger_generated, s.ledger_discarded = row["generated_tokens"], row["discarded_tokens"]
            s.ledger_cancelled = row["cancelled"]
    exact = [s for s in done if s.ledger_generated == s.received + s.ledger_discarded]
    # The server wrote more than the client read before it closed (tokens in flight: in the
    # socket when it left): delivered by the ledger's account, not received by the bench's.
    in_flight = [s for s in done if s.ledger_generated > s.received + s.ledger_discarded and s.mode == "disconnect"]
    ledger_sum = sum(max(0, s.ledger_generated) for s in done)
    result = {
        "settings": vars(args) | {"out": str(args.out)}, "elapsed_s": round(elapsed, 1),
        "streams": len(done), "rows_found": len(rows), "by_mode": {m: sum(1 for s in done if s.mode == m)
                                                                for m in ("disconnect", "cancel_call")},
        "received_tokens": sum(s.received for s in done),
        "ledger_generated_tokens": ledger_sum,
        "ledger_discarded_tokens": sum(max(0, s.ledger_discarded) for s in done),
        "engine_generated_tokens": after - before,
        "per_stream_exact": len(exact),
        "in_flight_at_close": len(in_flight),
        "rows_written_before_the_last_engine_output": late,
        "engine_exact": ledger_sum == after - before,
        "totals_exact": ledger_sum == after - before and len(exact) == len(done),
        "mismatches": [asdict(s) for s in done if s not in exact][:20],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "mismatches"}, indent=2))
    if result["mismatches"]:
        print("mismatches:", json.dumps(result["mismatches"], indent=1), file=sys.stderr)
    return 0 if result["engine_exact"] and len(exact) + len(in_flight) == len(done) else 1


if __name__ == "__main__":
    sys.exit(main())
