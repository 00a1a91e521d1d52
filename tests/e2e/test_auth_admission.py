"""API keys and admission control on a server started with keys and one slot."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import Server, start_server, stop_server
from tests.e2e.test_http import chat_body

pytestmark = pytest.mark.slow

KEY, OTHER_KEY, ADMIN, METRICS = "k-one", "k-two", "adm-key", "metrics-tok"


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("locked"), "--api-key", KEY, "--api-key", OTHER_KEY,
                     "--admin-key", ADMIN, "--metrics-token", METRICS, "--parallel", "1",
                     "--max-waiting", "1", "--max-wait", "1.5", "--ctx", "1024")
    yield s
    stop_server(s)


def test_keys_are_required_except_for_health(locked: Server) -> None:
    assert httpx.get(f"{locked.url}/health").status_code == 200
    r = httpx.get(f"{locked.base_url}/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{locked.base_url}/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(f"{locked.base_url}/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(f"{locked.base_url}/models", headers={"x-api-key": OTHER_KEY}).status_code == 200


def test_anthropic_paths_get_anthropic_error_envelope(locked: Server) -> None:
    r = httpx.post(f"{locked.base_url}/messages", json={})
    assert r.status_code == 401
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"


def test_openai_sdk_with_a_key(locked: Server) -> None:
    good = openai.OpenAI(base_url=locked.base_url, api_key=KEY, max_retries=0)
    assert good.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=3).choices[0].message.content is not None
    bad = openai.OpenAI(base_url=locked.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_metrics_need_the_metrics_token_or_a_key(locked: Server) -> None:
    assert httpx.get(f"{locked.url}/metrics").status_code == 401
    assert httpx.get(f"{locked.url}/metrics", headers={"Authorization": f"Bearer {METRICS}"}).status_code == 200
    assert httpx.get(f"{locked.url}/metrics", headers={"x-api-key": KEY}).status_code == 200


def test_the_admin_key_opens_metrics_too(locked: Server) -> None:
    # regression: the admin key works as an API key everywhere, /metrics included (it was a 401)
    assert httpx.get(f"{locked.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200


# Every destructive route (docs/api.md, "One rule for destructive operations").
DESTRUCTIVE = [
    ("DELETE", "/sessions/x", None),
    ("DELETE", "/snapshots/snap_0123456789abcdef0123456789abcdef", None),
    ("DELETE", "/responses/resp_x", None),
    ("POST", "/snapshots/snap_0123456789abcdef0123456789abcdef/load", {"session_id": "x", "force": True}),
]


@pytest.mark.parametrize(("method", "path", "body"), DESTRUCTIVE)
def test_destructive_operations_need_the_admin_key(locked: Server, method: str, path: str,
                                                   body: dict[str, object] | None) -> None:
    def call(key: str) -> httpx.Response:
        return httpx.request(method, locked.base_url + path, json=body, headers={"x-api-key": key}, timeout=10)

    plain = call(KEY)
    assert plain.status_code == 403, plain.text
    assert plain.json()["error"]["code"] == "insufficient_permissions"
    admin = call(ADMIN)
    assert admin.status_code not in (401, 403), admin.text  # past auth: the resource does not exist


def test_a_load_without_force_needs_only_an_api_key(locked: Server) -> None:
    r = httpx.post(f"{locked.base_url}/snapshots/snap_0123456789abcdef0123456789abcdef/load", json={"session_id": "x"},
                   headers={"x-api-key": KEY}, timeout=10)
    assert r.status_code == 404, r.text


def test_full_queue_and_queue_timeout_are_429_with_retry_after(locked: Server) -> None:
    auth = {"x-api-key": KEY}
    results: dict[str, httpx.Response] = {}

    def hold(name: str) -> None:
        results[name] = httpx.post(f"{locked.base_url}/chat/completions", headers=auth, timeout=180,
                                   json=chat_body(max_tokens=250, ignore_eos=True))

    metrics = {"Authorization": f"Bearer {METRICS}"}
    running = threading.Thread(target=hold, args=("running",))
    running.start()
    locked.wait_metric("hearth_running_sequences", lambda v: v == 1, metrics)
    waiting = threading.Thread(target=hold, args=("waiting",))
    waiting.start()
    locked.wait_metric("hearth_waiting_requests", lambda v: v == 1, metrics)
    full = httpx.post(f"{locked.base_url}/chat/completions", headers=auth, json=chat_body(max_tokens=2), timeout=30)
    assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
    assert int(full.headers["retry-after"]) >= 1
    waiting.join(180)
    running.join(180)
    assert results["running"].status_code == 200
    # the one-slot run takes longer than --max-wait 1.5 s, so the queued request times out
    assert results["waiting"].status_code == 429, results["waiting"].text
    assert results["waiting"].json()["error"]["code"] == "queue_timeout"


def test_non_loopback_bind_without_a_key_refuses_to_start() -> None:
    r = subprocess.run([sys.executable, "-m", "hearth.cli.main", "serve", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refusing to bind 0.0.0.0" in r.stderr
