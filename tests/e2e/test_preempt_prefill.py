"""Through the real server and model (hearth/engine/preempt.py): a `flex` request paused in the
middle of its prompt's prefill for a `priority` one resumes from where it stopped, with no
prompt token processed twice, and answers exactly as it does unpaused at temperature 0; the
priority request answers as it does alone.

Deterministic, never timed: the node has one slot and runs with a test gate folder
(hearth/test_gate.py). The gate `prefill-chunk-2` holds the engine thread after the step that
ran the flex prompt's second chunk (of ~14: ~1,800 tokens at 128 a step, a quarter of the
default --batch 512), so its prompt is certainly half done; the priority request is sent then
and waits in the engine's queue (`hearth_waiting_requests`: admission lets a higher class in at
once) before the gate opens. The next step boundary pauses the flex prompt (its two chunks' KV
to RAM) for it. The gate `prefill-chunk-3` then holds the engine after the flex prompt's third
chunk, which runs only once it has resumed: there the priority request has finished and the
flex one has generated nothing (on a node that cannot pause a prefill, the third chunk runs
first, and the flex request is paused only once generating). Nothing else runs meanwhile, and
the resumed prompt goes on in the same 128-token chunks into the same cells, so the flex answer
is compared exactly with its unpaused run.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from hearth import test_gate
from tests.e2e.test_interrupt_and_spec import stream_text
from tests.helpers import Server, start_server, stop_server, wait_until

pytestmark = pytest.mark.slow

GATE, AFTER = "prefill-chunk-2", "prefill-chunk-3"
LONG = " ".join(["the keeper climbed the stairs of the old lighthouse at dusk"] * 150)
FLEX = {"messages": [{"role": "user", "content": f"{LONG}\nSummarise."}], "temperature": 0, "max_tokens": 16,
        "ignore_eos": True, "cache_prompt": False, "speculative": False, "service_tier": "flex"}
URGENT = {"messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0, "max_tokens": 8,
          "ignore_eos": True, "cache_prompt": False, "speculative": False, "service_tier": "priority"}


def prefilled(server: Server, body: dict[str, Any]) -> tuple[tuple[str, str | None, int], float]:
    """A request run alone: its answer and the prompt tokens the node processed for it."""
    before = server.metric("hearth_prompt_tokens_total")
    answer = stream_text(server, body)
    return answer, server.metric("hearth_prompt_tokens_total") - before


def test_a_request_paused_in_its_prefill_resumes_there_and_answers_as_unpaused(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    server = start_server(tmp_path, "--parallel", "1", "--ctx", "4096", env={test_gate.ENV: str(gates)})
    paused_at, resumed_at = test_gate.hold_path(gates, GATE), test_gate.hold_path(gates, AFTER)
    try:
        flex_ref, flex_prompt = prefilled(server, FLEX)
        urgent_ref, urgent_prompt = prefilled(server, URGENT)
        assert flex_prompt > 1000 and flex_ref[1] == "length" and flex_ref[2] == 16
        names = ("hearth_preemptions_total", "hearth_prompt_tokens_total", "hearth_generated_tokens_total")
        before = {m: server.metric(m) for m in names}

        def delta(name: str) -> float:
            return server.metric(name) - before[name]

        got: dict[str, Any] = {}

        def send(name: str, body: dict[str, Any]) -> None:
            got[name] = stream_text(server, body)

        paused_at.touch()
        resumed_at.touch()
        flex = threading.Thread(target=send, args=("flex", FLEX))
        flex.start()
        wait_until(test_gate.waiting_path(gates, GATE).exists, "the flex prompt held after its second chunk", 300)
        urgent = threading.Thread(target=send, args=("urgent", URGENT))
        urgent.start()
        server.wait_metric("hearth_waiting_requests", lambda n: n >= 1)  # in the engine's queue
        paused_at.unlink()
        # The flex prompt's third chunk runs only once it is back in the slot: the urgent request
        # has then run whole, and the flex request has not produced a token (unpaused until its
        # prefill ends, it would be paused generating, and its third chunk would come first).
        wait_until(test_gate.waiting_path(gates, AFTER).exists, "the flex prompt held after its third chunk", 300)
        assert delta("hearth_preemptions_total") == 1 and server.metric("hearth_paused_requests") == 0
        assert delta("hearth_generated_tokens_total") == urgent_ref[2]  # the urgent request's only
        urgent.join(300)
        assert not urgent.is_alive() and got["urgent"] == urgent_ref
        resumed_at.unlink()
        flex.join(300)
        assert got["flex"] == flex_ref
        # zero re-prefill: every prompt token of both was processed exactly once
        assert delta("hearth_prompt_tokens_total") == flex_prompt + urgent_prompt
    finally:
        paused_at.unlink(missing_ok=True)
        resumed_at.unlink(missing_ok=True)
        stop_server(server)
