"""A node over the scripted fake runner (tests/fakes.py), served by uvicorn as `hearth serve`
serves the real one: the whole HTTP side, no model. Each decode step waits `--step-ms` (no CPU,
as a real decode would use the compute threads), so the event loop's CPU per token is all that
the process spends apart from the engine thread's bookkeeping. For bench.stream_cpu --fake.

    python -m bench.fake_node --port 8089 --step-ms 5
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import uvicorn

from hearth.api.app import create_app
from hearth.config import Settings
from tests.fakes import scripted_backend

ANSWER = "The dragon and the knight met at dawn by the river, and neither spoke first. " * 120


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--parallel", type=int, default=8)
    a = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="hearth-fake-node-"))
    weights = data / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, _ = scripted_backend(ANSWER, parallel=a.parallel, n_ctx=16384, path=weights,
                                  step_delay=a.step_ms / 1000)
    app = create_app(backend, Settings(data_dir=data, parallel=a.parallel))
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning", log_config=None, access_log=False)


if __name__ == "__main__":
    main()
