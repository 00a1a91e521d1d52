"""The chat page's model picker on a server with two models and --models-max 1 (the default
model, and a copy of it under another name in --models-dir): every model listed with its load
status, a switch that loads the other model (statuses follow), a session kept to its model."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from hearth.models import DEFAULT_MODEL_ID, embedded_model_path
from tests.helpers import Server, start_server, stop_server
from tests.web.page import chat_bodies, last_reply, send, wait_done

pytestmark = pytest.mark.slow

OTHER = "smol-copy"
STATUS_OF = "(id) => document.querySelector(`#model-select option[value='${id}']`).dataset.status"


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("web-models")
    models = tmp / "models"
    models.mkdir()
    shutil.copyfile(embedded_model_path(), models / f"{OTHER}.gguf")
    s = start_server(tmp, "--parallel", "2", "--ctx", "2048", "--models-max", "1", "--models-dir", str(models))
    yield s
    stop_server(s)


def wait_status(page: Any, model: str, status: str) -> None:
    page.wait_for_function(f"(id) => ({STATUS_OF})(id) === '{status}'", arg=model)


def sessions(server: Server) -> dict[str, str]:
    return {s["session_id"]: s["model"] for s in httpx.get(f"{server.url}/v1/sessions", timeout=10).json()["data"]}


def test_the_picker_lists_every_model_with_its_status_and_a_switch_loads_it(
        two_models: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(two_models, max_tokens=4, temperature=0)
    page.wait_for_selector("#model-select:not([hidden])")
    listed = [m["id"] for m in httpx.get(f"{two_models.url}/v1/models", timeout=10).json()["data"]]
    options = page.locator("#model-select option")
    assert options.evaluate_all("os => os.map(o => o.value)") == listed
    assert f"{DEFAULT_MODEL_ID} · loaded" in options.all_inner_texts()
    assert f"{OTHER} · unloaded" in options.all_inner_texts()

    bodies = chat_bodies(page)
    page.select_option("#model-select", OTHER)
    send(page, "Say hi.")
    wait_done(page)
    assert bodies[-1]["model"] == OTHER
    assert last_reply(page).get_attribute("data-finish") in ("stop", "length")
    wait_status(page, OTHER, "loaded")  # the page reads the statuses again after the turn
    wait_status(page, DEFAULT_MODEL_ID, "unloaded")  # --models-max 1: the default made room
    first = page.evaluate("() => state.sessionId")
    assert sessions(two_models)[first] == OTHER  # the session was made for the model picked

    page.select_option("#model-select", DEFAULT_MODEL_ID)  # another model: a new chat
    assert page.evaluate("() => state.sessionId") is None
    assert page.locator(".msg").count() == 0
    send(page, "Say hi.")
    wait_done(page)
    assert bodies[-1]["model"] == DEFAULT_MODEL_ID
    assert last_reply(page).get_attribute("data-finish") in ("stop", "length")
    wait_status(page, DEFAULT_MODEL_ID, "loaded")
    second = page.evaluate("() => state.sessionId")
    assert second != first and sessions(two_models)[second] == DEFAULT_MODEL_ID

    page.click(f"#session-list [data-session-id='{first}'] .item-main")  # its model comes back with it
    page.wait_for_function("(id) => state.sessionId === id", arg=first)
    assert page.input_value("#model-select") == OTHER
    assert page.errors == []
