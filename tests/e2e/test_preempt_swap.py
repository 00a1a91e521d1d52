"""Through the real server and model (issue 40, hearth/engine/preempt.py and swap.py): with
`--session-ram-mb 0` a paused request's KV cannot stay in RAM; it is written to disk, read back
when the request resumes, and the answer is exactly the unpaused one at temperature 0; the file
is gone once it resumed.

Deterministic, never timed (test gates, hearth/test_gate.py), as tests/e2e/test_preempt_prefill.py:
one slot; the gate `prefill-chunk-2` holds the engine after the `flex` prompt's second chunk, the
`priority` request is sent then and waits in the engine's queue; the gate opens and the next step
boundary pauses the flex prompt for it. The priority prompt is longer than one step (~650 tokens,
the step budget 512), so the gate `prefill-chunk-1` holds the engine after its first chunk: the
flex request certainly waits paused there, and the test waits until the swap store's writer has
put its KV on disk (`hearth_paused_kv_disk_bytes`, the file under the data directory) and left
none in RAM. Then it lets the engine go: the priority request ends, the flex prompt resumes from
the file, and the gate `prefill-chunk-3` (its third chunk, run only after it resumed) is where the
test sees that nothing of the paused KV is left, on disk or in RAM.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from hearth import test_gate
from tests.e2e.test_interrupt_and_spec import stream_text
from tests.e2e.test_preempt_prefill import FLEX, prefilled
from tests.helpers import start_server, stop_server, wait_until

pytestmark = pytest.mark.slow

PAUSE, URGENT_HELD, RESUMED = "prefill-chunk-2", "prefill-chunk-1", "prefill-chunk-3"
URGENT_TEXT = " ".join(["a red ball rolled down the hill past the green gate"] * 60)
URGENT = {"messages": [{"role": "user", "content": f"{URGENT_TEXT}\nWhat colour was the ball?"}],
          "temperature": 0, "max_tokens": 8, "ignore_eos": True, "cache_prompt": False, "speculative": False,
          "service_tier": "priority"}


def paused_files(home: Path) -> list[Path]:
    return sorted((home / "kv").rglob("paused~*.kv"))


def test_a_paused_requests_kv_goes_to_disk_and_it_resumes_exactly(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    server = start_server(tmp_path, "--parallel", "1", "--ctx", "4096", "--session-ram-mb", "0",
                          env={test_gate.ENV: str(gates)})
    home = tmp_path / "home"
    holds = {p: test_gate.hold_path(gates, p) for p in (PAUSE, URGENT_HELD, RESUMED)}
    try:
        flex_ref, flex_prompt = prefilled(server, FLEX)
        urgent_ref, urgent_prompt = prefilled(server, URGENT)
        assert flex_prompt > 1000 and 512 < urgent_prompt < 1024 and flex_ref[2] == 16
        before = {m: server.metric(m) for m in ("hearth_preemptions_total", "hearth_prompt_tokens_total")}
        got: dict[str, Any] = {}

        def send(name: str, body: dict[str, Any]) -> None:
            got[name] = stream_text(server, body)

        holds[PAUSE].touch()
        holds[RESUMED].touch()
        flex = threading.Thread(target=send, args=("flex", FLEX))
        flex.start()
        wait_until(test_gate.waiting_path(gates, PAUSE).exists, "the flex prompt held after its second chunk", 300)
        holds[URGENT_HELD].touch()  # from now on: the flex prompt is past its first chunk
        urgent = threading.Thread(target=send, args=("urgent", URGENT))
        urgent.start()
        server.wait_metric("hearth_waiting_requests", lambda n: n >= 1)  # in the engine's queue
        holds[PAUSE].unlink()
        wait_until(test_gate.waiting_path(gates, URGENT_HELD).exists, "the urgent prompt held after its first chunk",
                   300)
        # the flex request is paused now, its KV past a budget of 0: the writer puts it on disk
        assert server.metric("hearth_preemptions_total") - before["hearth_preemptions_total"] == 1
        assert server.metric("hearth_paused_requests") == 1
        server.wait_metric("hearth_paused_kv_disk_bytes", lambda n: n > 0)
        assert server.metric("hearth_paused_kv_ram_bytes") == 0
        (spilled,) = paused_files(home)
        assert spilled.stat().st_size > server.metric("hearth_paused_kv_disk_bytes")  # header + tokens + KV
        holds[URGENT_HELD].unlink()
        # the flex prompt's third chunk runs only once it is back in the slot, its KV read from disk
        wait_until(test_gate.waiting_path(gates, RESUMED).exists, "the flex prompt held after its third chunk", 300)
        assert server.metric("hearth_paused_requests") == 0 and paused_files(home) == []
        assert server.metric("hearth_paused_kv_disk_bytes") == 0 and server.metric("hearth_paused_kv_ram_bytes") == 0
        urgent.join(300)
        assert not urgent.is_alive() and got["urgent"] == urgent_ref
        holds[RESUMED].unlink()
        flex.join(300)
        assert got["flex"] == flex_ref  # the KV that went to disk and back: the unpaused answer
        # zero re-prefill: every prompt token of both was processed exactly once
        assert server.metric("hearth_prompt_tokens_total") - before["hearth_prompt_tokens_total"] == \
            flex_prompt + urgent_prompt
    finally:
        for hold in holds.values():
            hold.unlink(missing_ok=True)
        stop_server(server)
