"""Through the real server and model (scheduler.py, "Classes within a step"): an interactive
request that arrives while a `flex` request processes a long prompt stops that prompt's chunk
midway (hearth_interrupted_decodes_total), runs its own prompt first, and its output is the one
it gives alone at temperature 0; the flex request still finishes whole.

The flex text is not compared with its run alone: its prompt chunks ran beside the interactive
request's tokens here and alone in the reference, and llama.cpp's kernels are not
batch-invariant, so the last bits of its KV may differ (docs/api.md, "Reproducibility"); on the
main code, where the chunks shared every step with the interactive prompt, the same holds.

Why the interrupt is certain to be tried: the flex prompt (~1,800 tokens, cache_prompt false)
goes in at most 128 tokens per step (a quarter of the default --batch 512), so its prefill is
about 14 steps, and the interactive request is sent as soon as the flex request holds a slot;
the attempt repeats (at most 3 times) should the flex prompt ever finish first."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.e2e.test_http import wait_idle
from tests.e2e.test_interrupt_and_spec import stream_text
from tests.helpers import Server

pytestmark = pytest.mark.slow

LONG = " ".join(["the keeper climbed the stairs of the old lighthouse at dusk"] * 150)
FLEX = {"messages": [{"role": "user", "content": f"{LONG}\nSummarise."}], "temperature": 0, "max_tokens": 12,
        "ignore_eos": True, "cache_prompt": False, "speculative": False, "service_tier": "flex"}
CHAT = {"messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0, "max_tokens": 12,
        "ignore_eos": True, "cache_prompt": False, "speculative": False}


def test_an_interactive_request_interrupts_a_flex_prompt_and_no_output_changes(server: Server) -> None:
    wait_idle(server)
    _, _, len_ref = stream_text(server, FLEX)
    chat_ref, _, _ = stream_text(server, CHAT)
    for _attempt in range(3):
        before = server.metric("hearth_interrupted_decodes_total")
        got: dict[str, Any] = {}

        def run_flex(got: dict[str, Any] = got) -> None:
            got["flex"] = stream_text(server, FLEX)

        flex = threading.Thread(target=run_flex)
        flex.start()
        server.wait_metric("hearth_running_sequences", lambda n: n >= 1)  # the flex request is placed
        chat_text, _, _ = stream_text(server, CHAT)
        flex.join(300)
        assert chat_text == chat_ref
        assert got["flex"][1] == "length" and got["flex"][2] == len_ref
        if server.metric("hearth_interrupted_decodes_total") > before:
            break
    else:
        pytest.fail("the interactive request never arrived during the flex prompt")
