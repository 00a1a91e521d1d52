"""The published OpenAPI document, fuzzed: schemathesis generates a few thousand requests from
GET /openapi.json (valid and invalid bodies, odd path ids, every route) against the real server
on the default model, and fails on any 5xx, any answer outside the documented statuses, media
types and shapes, any request that hangs (no answer in --request-timeout), and a server that no
longer answers a normal request afterwards.

Generation is capped at a few tokens per request (tests/e2e/fuzz_hooks.py); the seed is fixed so a
CI run is reproducible (HEARTH_FUZZ_SEED picks another, HEARTH_FUZZ_EXAMPLES the cases per route).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_openapi_schema_fuzzed_against_the_real_server(tmp_path: Path) -> None:
    # One llama.cpp thread: the fuzzer needs the other core, and spinning threads that share a
    # core with it slow every generation down many times over.
    # Its own empty model cache: the fuzzer reaches Ollama's /api/pull and /api/delete as the admin
    # (no keys), and must never touch the machine's installed models (the agent tests need them).
    # The model is named with --model, so it is pinned: Ollama's `keep_alive: 0` (which the fuzzer
    # sends) cannot unload it, and no later case waits for a reload under a generated time cap of
    # ~0 s (a documented 503 `model_loading`, which a fuzzer that never unloads cannot reach).
    server = start_server(tmp_path, "--threads", "1", "--ctx", "512", "--parallel", "4", "--model", "default",
                          env={"HEARTH_MODELS": str(tmp_path / "models")})
    try:
        seed = os.environ.get("HEARTH_FUZZ_SEED", "3")
        examples = os.environ.get("HEARTH_FUZZ_EXAMPLES", "100")
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.e2e.fuzz_hooks",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        t0 = time.monotonic()
        run = subprocess.run(
            [str(Path(sys.executable).parent / "schemathesis"), "run", f"{server.url}/openapi.json",
             "--checks", CHECKS, "--phases", "examples,fuzzing", "--max-examples", examples, "--seed", seed,
             "--workers", "2", "--request-timeout", "60", "--output-sanitize", "false", "--no-color",
             "--report", "json", "--report-dir", str(tmp_path / "report")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1400)
        elapsed = time.monotonic() - t0
        reports = list((tmp_path / "report").glob("json-*.json"))
        assert reports, f"schemathesis wrote no report:\n{run.stdout[-5000:]}\n{run.stderr[-3000:]}"
        report = json.loads(reports[0].read_text())
        cases = report["test_cases"]
        print(f"\nfuzz: seed {seed}, {cases['generated']} cases in {elapsed:.0f}s, {cases['with_failures']} with "
              f"failures, {cases['errored']} errored (hangs and network errors), exit {run.returncode}")
        assert run.returncode == 0 and not report["failures"] and not report["errors"], run.stdout[-20000:]
        assert cases["generated"] >= 2000 and cases["with_failures"] == 0 and cases["errored"] == 0

        # ... and the server still serves.
        assert server.proc.poll() is None, "the server died under the fuzzer"
        assert httpx.get(f"{server.url}/health", timeout=30).json() == {"status": "ok"}
        r = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    finally:
        stop_server(server)
