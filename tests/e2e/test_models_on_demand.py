"""Two real models in one server with --models-max 1: the embedded default (loaded at start)
and the 32k coder model (installed by scripts/setup_agents.sh, loaded when a request names it),
plus a corrupt GGUF beside a good one in --models-dir. Alternating requests, a burst that
makes one load, a session that continues from its KV after its model was unloaded and loaded
again, keep_alive 0 giving the memory back, a cancel during a load, a failed load that leaves
the rest serving.

Nothing here reads what the models improvise: answers are compared with the same model's own
answer to the same prompt (temperature 0, no reused prefix) before its unload."""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest

from hearth import catalog
from hearth import test_gate as load_gate
from hearth.models import DEFAULT_MODEL_ID, embedded_model_path
from tests.helpers import EXACT, Server, sample, start_server, stop_server, wait_until

pytestmark = pytest.mark.slow

CODER = catalog.QWEN_CODER.id
PROMPT = [{"role": "user", "content": "Name one colour of the rainbow."}]


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the server's load gate (hearth.test_gate): a test holds a
    model's load there, so it knows the load is under way while it looks, and ends it itself."""
    return tmp_path_factory.mktemp("load-gate")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[Server]:
    if not catalog.installed_path(catalog.QWEN_CODER).is_file():
        pytest.fail(f"{CODER} is not installed: run scripts/setup_agents.sh (hearth models install {CODER})")
    tmp = tmp_path_factory.mktemp("on-demand")
    models = tmp / "models"
    models.mkdir()
    with embedded_model_path().open("rb") as f:  # a download cut short: a whole header, tensors missing
        (models / "broken.gguf").write_bytes(f.read(8 << 20))
    shutil.copyfile(embedded_model_path(), models / "smol-copy.gguf")  # a good one beside it
    s = start_server(tmp, "--models-max", "1", "--ctx", "2048", "--parallel", "2", "--models-dir", str(models),
                     "--sse-heartbeat", "0.2", env={load_gate.ENV: str(gate)})
    yield s
    stop_server(s)


def chat(s: Server, model: str, messages: list[dict[str, Any]] = PROMPT, timeout: float = 300,
         **extra: Any) -> httpx.Response:
    return httpx.post(f"{s.url}/v1/chat/completions", timeout=timeout,
                      json={"model": model, "messages": messages, "temperature": 0, "max_tokens": 16, **extra})


def answer(s: Server, model: str, **extra: Any) -> str:
    r = chat(s, model, **EXACT, **extra)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    return str(r.json()["choices"][0]["message"]["content"])


def status(s: Server) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in httpx.get(f"{s.url}/v1/models", timeout=10).json()["data"]}


def loads(s: Server, model: str) -> float:
    return sample(httpx.get(f"{s.url}/metrics", timeout=10).text, "hearth_model_loads_total", 0.0, model=model)


def users(s: Server, model: str) -> int:
    data = httpx.get(f"{s.url}/v1/models", timeout=10).json()["data"]
    return int(next(m for m in data if m["id"] == model)["status"]["users"])


def cancellations(s: Server, reason: str) -> float:
    return sample(httpx.get(f"{s.url}/metrics", timeout=10).text, "hearth_cancellations_total", 0.0, cause=reason)


@contextlib.contextmanager
def held_load(gate: Path, model: str) -> Iterator[None]:
    """While inside, a load of `model` waits at the gate (it is held at most until the block ends)."""
    load_gate.hold_path(gate, model).touch()
    try:
        yield
    finally:
        release(gate, model)


def release(gate: Path, model: str) -> None:
    load_gate.hold_path(gate, model).unlink(missing_ok=True)


def wait_loading(gate: Path, model: str) -> None:
    """Until the load of `model` waits at the gate: it is under way, and stays so until released."""
    wait_until(lambda: load_gate.waiting_path(gate, model).exists(), f"the load of {model} to reach the gate", 120)


def until_line(lines: Iterator[str], found: Callable[[str], bool]) -> list[str]:
    """The stream's lines up to and including the first that `found` accepts (AssertionError if it ends first)."""
    seen = []
    for line in lines:
        seen.append(line)
        if found(line):
            return seen
    raise AssertionError(f"the stream ended without the line looked for: {seen[-6:]}")


def rss(s: Server) -> int:
    """The server process's resident memory, bytes (/proc)."""
    for line in Path(f"/proc/{s.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_every_installed_model_is_listed_and_only_the_default_is_loaded(srv: Server) -> None:
    st = status(srv)
    assert st[DEFAULT_MODEL_ID] == "loaded" and st[CODER] == "unloaded"
    assert st["broken"] == "unloaded" and st["smol-copy"] == "unloaded"


def test_alternating_requests_load_each_model_in_turn(srv: Server) -> None:
    first = answer(srv, DEFAULT_MODEL_ID)
    coder_before = loads(srv, CODER)
    coder = answer(srv, CODER)
    assert status(srv)[CODER] == "loaded" and status(srv)[DEFAULT_MODEL_ID] == "unloaded"  # --models-max 1
    assert answer(srv, DEFAULT_MODEL_ID) == first  # the same model answers again, loaded again
    assert answer(srv, CODER) == coder
    assert loads(srv, CODER) == coder_before + 2


def test_a_burst_for_an_unloaded_model_makes_one_load(srv: Server) -> None:
    answer(srv, DEFAULT_MODEL_ID)  # the coder model is unloaded now
    before = loads(srv, CODER)
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(chat(srv, CODER))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [r.status_code for r in results] == [200] * 4
    assert loads(srv, CODER) == before + 1


def test_a_session_continues_from_its_kv_after_its_model_was_unloaded(srv: Server) -> None:
    body = {"session_id": "on-demand-1", "max_tokens": 8}
    first = chat(srv, DEFAULT_MODEL_ID, [{"role": "system", "content": "You answer briefly."}, *PROMPT], **body)
    assert first.status_code == 200, first.text
    prompt = first.json()["usage"]["prompt_tokens"]
    answer(srv, CODER)  # --models-max 1: the default model is unloaded, its session's KV written to disk
    assert status(srv)[DEFAULT_MODEL_ID] == "unloaded"
    session = httpx.get(f"{srv.url}/v1/sessions/on-demand-1", timeout=10).json()
    assert session["residency"] == "disk"
    second = chat(srv, DEFAULT_MODEL_ID, [{"role": "user", "content": "And another?"}], **body)
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt


def test_keep_alive_zero_unloads_at_once_and_gives_the_memory_back(srv: Server) -> None:
    answer(srv, CODER)
    loaded = rss(srv)
    answer(srv, CODER, keep_alive=0)
    wait_until(lambda: status(srv)[CODER] == "unloaded", "the coder model to be unloaded", 60)
    after = rss(srv)
    print(f"RSS with {CODER} loaded: {loaded >> 20} MiB; after keep_alive 0: {after >> 20} MiB")
    assert loaded - after > 200 << 20  # its weights (~470 MiB mapped, most of it touched) and KV


def test_a_cancel_during_a_load_ends_the_request(srv: Server, gate: Path) -> None:
    answer(srv, DEFAULT_MODEL_ID)  # the coder model is unloaded
    result: list[httpx.Response] = []
    with held_load(gate, CODER):
        waiting = threading.Thread(target=lambda: result.append(chat(srv, CODER, cancel_id="load-cancel")))
        waiting.start()
        wait_loading(gate, CODER)
        cancelled = httpx.post(f"{srv.url}/v1/cancel", json={"cancel_id": "load-cancel"}, timeout=10).json()
        waiting.join(120)
        assert not waiting.is_alive()  # answered while the load is still held
        assert status(srv)[CODER] == "loading"
    assert cancelled == {"cancelled": 1}
    [r] = result
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "cancelled"
    assert r.json()["usage"]["completion_tokens"] == 0
    wait_until(lambda: status(srv)[CODER] == "loaded", "the load to complete anyway", 120)
    assert users(srv, CODER) == 0  # the request that left holds nothing


# Each protocol's stream for a model being loaded: (path, body, what its opening event contains,
# what its heartbeat is, what its last event contains).
STREAMS = {
    "chat": ("/v1/chat/completions", {"messages": PROMPT, "max_tokens": 8},
             '"role":"assistant"', ": keep-alive", "data: [DONE]"),
    "completions": ("/v1/completions", {"prompt": "Colours of the rainbow:", "max_tokens": 8},
                    '"object":"text_completion"', ": keep-alive", "data: [DONE]"),
    "messages": ("/v1/messages", {"messages": PROMPT, "max_tokens": 8},
                 "event: message_start", "event: ping", "event: message_stop"),
    "responses": ("/v1/responses", {"input": "Name one colour of the rainbow.", "max_output_tokens": 16},
                  "event: response.created", ": keep-alive", "event: response.completed"),
}


@pytest.mark.parametrize("protocol", list(STREAMS))
def test_a_stream_opens_and_beats_while_its_model_loads(srv: Server, gate: Path, protocol: str) -> None:
    path, extra, opening, beat, last = STREAMS[protocol]
    answer(srv, DEFAULT_MODEL_ID)  # the coder model is unloaded
    body = {"model": CODER, "temperature": 0, "stream": True, **extra}
    with held_load(gate, CODER), httpx.stream("POST", f"{srv.url}{path}", json=body, timeout=300) as r:
        assert r.status_code == 200  # the status line and headers: sent during the load
        lines = r.iter_lines()
        until_line(lines, lambda line: opening in line)  # the opening event: during the load
        wait_loading(gate, CODER)
        assert status(srv)[CODER] == "loading"
        # then heartbeats while the load is held (Messages sends one ping with message_start: two)
        for _ in range(2 if protocol == "messages" else 1):
            until_line(lines, lambda line: line == beat)
        assert status(srv)[CODER] == "loading"
        release(gate, CODER)  # the load ends: the answer follows in the same stream
        rest = list(lines)
    assert any(last in line for line in rest), rest[-6:]
    assert status(srv)[CODER] == "loaded"


def test_a_client_that_leaves_during_a_load_is_cancelled_and_the_load_completes(srv: Server, gate: Path) -> None:
    answer(srv, DEFAULT_MODEL_ID)  # the coder model is unloaded
    before = cancellations(srv, "disconnect")
    body = {"model": CODER, "messages": PROMPT, "max_tokens": 8, "stream": True}
    with held_load(gate, CODER):
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, timeout=300) as r:
            lines = r.iter_lines()  # held: a line iterator dropped early closes the connection
            until_line(lines, lambda line: '"role":"assistant"' in line)
            wait_loading(gate, CODER)
        # the connection is closed: the run ends as a disconnect, while the load is still held
        wait_until(lambda: cancellations(srv, "disconnect") == before + 1, "the disconnect to end the run", 60)
        assert status(srv)[CODER] == "loading"
    wait_until(lambda: status(srv)[CODER] == "loaded", "the load to complete anyway", 120)
    assert users(srv, CODER) == 0


def test_a_corrupt_gguf_fails_with_its_name_and_the_others_serve(srv: Server) -> None:
    r = chat(srv, "broken")
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "model_load_failed" and "'broken'" in err["message"]
    assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
    assert answer(srv, "smol-copy")  # the good file beside it
    assert answer(srv, DEFAULT_MODEL_ID)


def test_hearth_chat_model_talks_to_that_model(srv: Server) -> None:
    """`hearth chat --model`: its session is made for that model, which loads for it."""
    answer(srv, DEFAULT_MODEL_ID)  # smol-copy is unloaded
    hearth = str(Path(sys.executable).parent / "hearth")
    child = pexpect.spawn(hearth, ["chat", "--url", srv.url, "--model", "smol-copy", "--session", "cli-model",
                                   "--max-tokens", "4", "--temperature", "0", "--plain"],
                          encoding="utf-8", timeout=120, dimensions=(50, 200))
    child.logfile_read = sys.stdout  # shown by pytest on failure
    child.expect_exact("hearth chat · smol-copy at")
    child.expect_exact("you> ")
    child.sendline("Say hi.")
    child.expect_exact("you> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    session = httpx.get(f"{srv.url}/v1/sessions/cli-model", timeout=10).json()
    assert session["model"] == "smol-copy" and session["message_count"] == 2
    assert status(srv)["smol-copy"] == "loaded"
