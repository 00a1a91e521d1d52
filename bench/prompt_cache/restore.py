"""The prompt cache's restore path alone (issue 38, "restores at disk speed"): read a prompt's
blocks from disk, check them, lay them into one sequence state and load it into llama.cpp,
the way Hearth did before (SHA-256 per block, a join that copies each piece twice, a padding
copy in `state_set`) and the way it does now (xxh3-128 hashed as each chunk is read into the
block's buffer; each byte copied once, into the buffer llama.cpp reads), alternated round by
round in one process on the same files.

    .venv/bin/python -m bench.prompt_cache.restore                 # 11,520 tokens (Claude Code's prompt), 6 rounds
    .venv/bin/python -m bench.prompt_cache.restore --tokens 4096 --rounds 3

The model is loaded (the catalog's qwen2.5-coder-0.5b unless `--model`) only for its KV layout
and for llama.cpp's own load (`llama_state_seq_set_data`), with Hearth's default four slots;
the block payloads are random bytes of exactly the layout's size (llama.cpp copies them into
the KV cells without reading them as numbers), so no prefill is needed. The files are read
through the page cache, as a restart on the same machine reads them (nothing here drops it).
Reported per path: the median wall time of each stage (read and check, join, llama.cpp load)
and MB/s of payload over the whole. Writes bench/results/restore-<stamp>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.config import RESULTS_DIR
from bench.machine import machine_info
from bench.report import save_json
from bench.stats import median
from hearth.backends.llamacpp import seq_state
from hearth.engine.prefix_cache import files

BLOCK = 256


# ---- the previous version's restore path, kept here to measure against ------------------------

def old_write(directory: Path, key: bytes, tokens: list[int], payload: bytes) -> Path:
    """A version-1 file: b"HKB1", a JSON header with the payload's SHA-256."""
    header = json.dumps({"fingerprint": {}, "parent": "0" * 32, "start": 0, "n_tokens": len(tokens),
                         "kv_bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
                         "kept": False}).encode()
    path = directory / f"{key.hex()}.kvb"
    path.write_bytes(b"HKB1" + struct.pack("<I", len(header)) + header
                     + np.asarray(tokens, dtype="<i4").tobytes() + payload)
    return path


def old_read(path: Path, kv_bytes: int, sha256: str) -> bytes:
    """files.read_payload before: one read, then SHA-256 over it."""
    with path.open("rb") as f:
        f.seek(path.stat().st_size - kv_bytes)
        data = f.read(kv_bytes + 1)
    if len(data) != kv_bytes or hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError("checksum mismatch")
    return data


def old_join(layout: seq_state.KVLayout, parts: list[tuple[bytes, int, int]]) -> bytes:
    """seq_state.join_blocks before: views per block, each piece `tobytes`, then one join."""
    total = sum(u for _, _, u in parts)
    views = []
    for payload, n, use in parts:
        buf = np.frombuffer(payload, dtype=np.uint8)
        off, k, v = 0, [], []
        for row in layout.k_rows:
            k.append(buf[off:off + n * row].reshape(n, row)[:use])
            off += n * row
        for row, el in zip(layout.v_rows, layout.v_el, strict=True):
            block = buf[off:off + n * row]
            v.append(block.reshape(row // el, n, el)[:, :use] if layout.v_trans else block.reshape(n, row)[:use])
            off += n * row
        views.append((k, v))
    meta = np.zeros((total, 3), dtype="<i4")
    meta[:, 0] = np.arange(total)
    meta[:, 1] = 1
    u32 = 4
    chunks: list[bytes | np.ndarray] = [layout.header, (1).to_bytes(u32, "little"), total.to_bytes(u32, "little"),
                                        meta, int(layout.v_trans).to_bytes(u32, "little"),
                                        len(layout.k_rows).to_bytes(u32, "little")]
    for i, head in enumerate(layout.k_heads):
        chunks.append(head)
        chunks.extend(k[i] for k, _ in views)
    for i, head in enumerate(layout.v_heads):
        chunks.append(head)
        if layout.v_trans:
            chunks.append(np.concatenate([v[i] for _, v in views], axis=1))
        else:
            chunks.extend(v[i] for _, v in views)
    return b"".join(c if isinstance(c, bytes) else np.ascontiguousarray(c).tobytes() for c in chunks)


# ---- the run -----------------------------------------------------------------------------------

def default_model() -> Path:
    from hearth.models import resolve_model
    return resolve_model("qwen2.5-coder-0.5b").path


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.prompt_cache.restore", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=11520, help="prompt tokens restored (default: 45 blocks)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--model", type=Path, default=None, help="GGUF file (default: qwen2.5-coder-0.5b's)")
    ap.add_argument("--slots", type=int, default=4, help="sequences in the context (Hearth's --parallel)")
    a = ap.parse_args(argv)
    from hearth.backends.llamacpp.runner import LlamaCppRunner

    model = a.model or default_model()
    seq_ctx = -(-(a.tokens + BLOCK) // BLOCK) * BLOCK
    runner = LlamaCppRunner(model, seq_ctx=seq_ctx, n_seq_max=a.slots, n_threads=2)
    layout = runner._layout()
    rng = np.random.default_rng(0)
    blocks = [(s, min(BLOCK, a.tokens - s)) for s in range(0, a.tokens, BLOCK)]
    with tempfile.TemporaryDirectory(prefix="hearth-restore-bench-") as tmp:
        new_dir, old_dir = Path(tmp, "new"), Path(tmp, "old")
        new_dir.mkdir()
        old_dir.mkdir()
        new_files, old_files, parent = [], [], b"\0" * files.KEY_BYTES
        for start, n in blocks:
            tokens = rng.integers(0, 1000, n).tolist()
            payload = rng.integers(0, 256, n * layout.per_token, dtype=np.uint8).tobytes()
            key = files.block_key(parent, tokens)
            h = files.write_block(new_dir, key, parent, start, tokens, payload, {}, False)
            new_files.append((files.block_path(new_dir, key), h))
            old_files.append((old_write(old_dir, key, tokens, payload), n, hashlib.sha256(payload).hexdigest()))
            parent = key
        payload_bytes = sum(h.kv_bytes for _, h in new_files)

        def old_path() -> dict[str, float]:
            data, t_read = timed(lambda: [old_read(p, n * layout.per_token, d) for p, n, d in old_files])
            parts = [(x, n, n) for x, (_, n, _) in zip(data, old_files, strict=True)]
            joined, t_join = timed(lambda: old_join(layout, parts))
            _, t_load = timed(lambda: runner.state_set(0, joined))  # its as_streams copy, then llama.cpp
            return {"read_check_s": t_read, "join_s": t_join, "load_s": t_load}

        def new_path() -> dict[str, float]:
            data, t_read = timed(lambda: [files.read_payload(p, h) for p, h in new_files])
            parts = [(x, len(h.tokens), len(h.tokens)) for x, (_, h) in zip(data, new_files, strict=True)]
            # state_set_blocks = join straight into the streams' buffer + llama.cpp's load, timed apart
            n_stream = 1 if runner.kv_unified else runner.n_seq_max
            joined, t_join = timed(lambda: seq_state.join_blocks(layout, parts, n_stream))
            _, t_load = timed(lambda: runner._load_state(0, joined))
            return {"read_check_s": t_read, "join_s": t_join, "load_s": t_load}

        # the same KV either way: the new buffer is the old join with its streams
        old_parts = [(old_read(p, n * layout.per_token, d), n, n) for p, n, d in old_files]
        new_parts = [(files.read_payload(p, h), len(h.tokens), len(h.tokens)) for p, h in new_files]
        assert seq_state.join_blocks(layout, new_parts, runner.n_seq_max) == seq_state.as_streams(
            old_join(layout, old_parts), len(layout.header), runner.n_seq_max)
        del old_parts, new_parts
        rounds: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        for r in range(a.rounds):
            order = [("old", old_path), ("new", new_path)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                got = fn()
                got["total_s"] = sum(got.values())
                rounds[name].append(got)
                runner.kv_remove(0, -1, -1)
    runner.close()
    summary: dict[str, Any] = {"tokens": a.tokens, "blocks": len(blocks), "payload_mb": payload_bytes / 1e6}
    print(f"restore of {a.tokens} tokens ({len(blocks)} blocks, {payload_bytes / 1e6:.1f} MB of KV), "
          f"{a.rounds} alternated rounds, medians:")
    print(f"{'path':6} {'read+check':>11} {'join':>8} {'load':>8} {'total':>8} {'MB/s':>8}")
    for name, rs in rounds.items():
        med = {k: float(median([x[k] for x in rs]) or 0.0) for k in rs[0]}
        mbps = payload_bytes / 1e6 / med["total_s"]
        summary[name] = {**{k: round(v, 4) for k, v in med.items()}, "mb_per_s": round(mbps)}
        print(f"{name:6} {med['read_check_s']:>10.3f}s {med['join_s']:>7.3f}s {med['load_s']:>7.3f}s "
              f"{med['total_s']:>7.3f}s {mbps:>8.0f}")
    summary["speedup"] = round(summary["old"]["total_s"] / summary["new"]["total_s"], 2)
    print(f"new/old speed: {summary['speedup']}x")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    out = {"schema": "hearth-bench-restore/1", "timestamp": stamp, "machine": machine_info(),
           "model": str(model), "command": " ".join([sys.executable, "-m", "bench.prompt_cache.restore",
                                                     *(argv if argv is not None else sys.argv[1:])]),
           "load_avg": os.getloadavg(), "summary": summary, "rounds": rounds}
    path, _ = save_json(out, RESULTS_DIR, "restore")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
