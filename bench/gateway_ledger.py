"""The gateway's usage-ledger writer in process (hearth/gateway/store/usage.py), on SQLite: a
writer that writes per wakeup (the code at a given git revision, `--before`) against the
lingering one (this tree), alternated in rounds in one run.

Each round relays `--rate` turns a second for `--seconds` (rows recorded in ticks of 1 ms, the
writer free to wake between any two), while a ticker measures the event loop's lag (how late a
1 ms sleep wakes: what every relayed stream waits behind when a commit runs on the loop). Then
a flood: `--flood` rows recorded as fast as the loop goes, timed until all are committed (the
rows a second the writer absorbs).

    .venv/bin/python -m bench.gateway_ledger --before HEAD~1 --rounds 3

Not a test: numbers, no thresholds.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from hearth.gateway.store.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parent.parent
PATH = "hearth/gateway/store/usage.py"


def module_at(rev: str | None) -> ModuleType:
    """store/usage.py as it is in this tree (None) or at `rev`, imported under a name of its own."""
    if rev is None:
        from hearth.gateway.store import usage
        return usage
    text = subprocess.run(["git", "show", f"{rev}:{PATH}"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout
    path = Path(tempfile.mkdtemp()) / "usage_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("usage_before", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["usage_before"] = mod
    spec.loader.exec_module(mod)
    return mod


def row(mod: ModuleType, n: int) -> Any:
    return mod.TurnUsage(at=time.time(), request_id=f"chatcmpl-{n}", gateway="g", tenant="t", key="k", via=None,
                         model="smol", endpoint="chat", node="a", nodes="a", prompt_tokens=30, cached_tokens=10,
                         generated_tokens=20, total_ms=12.0)


async def one_round(mod: ModuleType, folder: Path, rate: int, seconds: float, flood: int) -> dict[str, float]:
    store = SqliteStore(folder / f"gw-{time.monotonic_ns()}.sqlite3")
    await store.open()
    ledger = mod.GatewayLedger(store)
    writes: list[float] = []
    write = ledger._write

    async def timed(batch: list[Any]) -> None:
        t = time.perf_counter()
        await write(batch)
        writes.append(time.perf_counter() - t)

    ledger._write = timed
    ledger.start()
    lags: list[float] = []
    running = True

    async def ticker() -> None:
        while running:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    tick = asyncio.create_task(ticker())
    per_ms = rate / 1000
    owed = 0.0
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        owed += per_ms
        while owed >= 1:
            ledger.record(row(mod, n))
            n += 1
            owed -= 1
            await asyncio.sleep(0)  # the writer may wake between any two rows
        await asyncio.sleep(0.001)
    await ledger.flush(30)
    running = False
    await tick
    steady = {"rows": n, "transactions": len(writes), "write_ms_per_1k_rows": 1000 * sum(writes) / max(n, 1) * 1000,
              "lag_p50_ms": 1000 * statistics.median(lags), "lag_p99_ms": 1000 * statistics.quantiles(lags, n=100)[98],
              "lag_max_ms": 1000 * max(lags), "dropped": ledger.dropped}
    before = len(writes)
    t1 = time.perf_counter()
    for i in range(flood):
        ledger.record(row(mod, n + i))
        await asyncio.sleep(0)
    await ledger.flush(60)
    flood_s = time.perf_counter() - t1
    await ledger.close()
    await store.close()
    return {**steady, "flood_rows_per_s": flood / flood_s, "flood_transactions": len(writes) - before,
            "flood_dropped": ledger.dropped - steady["dropped"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="HEAD~1", help="the git revision of the per-wakeup writer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=int, default=1000, help="turns a second in the steady part")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--flood", type=int, default=20_000)
    args = ap.parse_args()
    variants = {"before": module_at(args.before), "linger": module_at(None)}
    got: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, mod in (variants.items() if r % 2 == 0 else reversed(variants.items())):
                res = asyncio.run(one_round(mod, Path(tmp), args.rate, args.seconds, args.flood))
                got[name].append(res)
                print(f"round {r + 1} {name:7s} " + " ".join(f"{k}={v:.4g}" for k, v in res.items()), flush=True)
    print("\nmedians over rounds")
    for name, runs in got.items():
        print(f"{name:7s} " + " ".join(f"{k}={statistics.median(x[k] for x in runs):.4g}" for k in runs[0]))


if __name__ == "__main__":
    main()
