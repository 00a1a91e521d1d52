"""API keys and admission control on a server started with keys and one slot."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.test_http import chat_body
from tests.helpers import Server, start_server, stop_server

pytestmark = pytest.mark.slow

KEY, OTHER_KEY, ADMIN, METRICS = "k-one", "k-two", "adm-key", "metrics-tok"


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Keys, one slot and a queue of one. --max-wait is long (the queue-full test's waiter must
    still be queued when the third request comes, however slow the machine); the queue timeout
    has its own server (`impatient`). --ctx 8192 gives the slot holder a budget that cannot end
    on its own while a test needs it (HOLD)."""
    s = start_server(tmp_path_factory.mktemp("locked"), "--api-key", KEY, "--api-key", OTHER_KEY,
                     "--admin-key", ADMIN, "--metrics-token", METRICS, "--parallel", "1",
                     "--max-waiting", "1", "--max-wait", "600", "--ctx", "8192")
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def impatient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One slot, and a queued request gives up after --max-wait 1 s."""
    s = start_server(tmp_path_factory.mktemp("impatient"), "--parallel", "1", "--max-waiting", "1",
                     "--max-wait", "1", "--ctx", "8192")
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
    with openai.OpenAI(base_url=locked.base_url, api_key=KEY, max_retries=0) as good:
        assert good.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=3).choices[0].message.content is not None
    with openai.OpenAI(base_url=locked.base_url, api_key="wrong", max_retries=0) as bad, \
            pytest.raises(openai.AuthenticationError):
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


# The slot holder: 8,000 tokens that only a cancel ends in time. ignore_eos bans the end of
# generation (loop detection is off by default) and speculative decoding is off, so no step emits
# more than one token. 8,000 tokens of this 135M model are > 2 TFLOP: more than 10 s of a 2-thread
# CPU even at its peak, where the tests below need the slot held for a few HTTP round trips (and
# one --max-wait of 1 s). Every test that uses it asserts it ended "cancelled": proof that it held
# the slot until the test had its verdict.
HOLD = {"max_tokens": 8000, "ignore_eos": True, "speculative": False}


class Holder:
    """A request that holds the only slot (in a thread) until `release()` cancels it."""

    def __init__(self, server: Server, cancel_id: str, headers: dict[str, str] | None = None,
                 metric_headers: dict[str, str] | None = None) -> None:
        self.server, self.cancel_id, self.headers = server, cancel_id, headers or {}
        self.response: httpx.Response | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        server.wait_metric("hearth_running_sequences", lambda v: v == 1, metric_headers)

    def _run(self) -> None:
        self.response = httpx.post(f"{self.server.base_url}/chat/completions", headers=self.headers, timeout=600,
                                   json=chat_body(cancel_id=self.cancel_id, **HOLD))

    def release(self) -> None:
        r = httpx.post(f"{self.server.base_url}/cancel", headers=self.headers, json={"cancel_id": self.cancel_id},
                       timeout=30)
        assert r.status_code == 200 and r.json() == {"cancelled": 1}, r.text  # it was still running
        self.thread.join(120)
        assert self.response is not None and self.response.status_code == 200, self.response
        assert self.response.json()["choices"][0]["finish_reason"] == "cancelled"


def test_a_full_queue_is_a_429_with_retry_after(locked: Server) -> None:
    """Deterministic: the holder ends only when cancelled, the waiter cannot time out (--max-wait
    600), so the third request meets a full queue whatever the machine's speed."""
    auth = {"x-api-key": KEY}
    metrics = {"Authorization": f"Bearer {METRICS}"}
    holder = Holder(locked, "hold-full", auth, metrics)
    waited: dict[str, httpx.Response] = {}

    def wait() -> None:
        waited["r"] = httpx.post(f"{locked.base_url}/chat/completions", headers=auth, timeout=600,
                                 json=chat_body(max_tokens=2))

    waiter = threading.Thread(target=wait)
    waiter.start()
    locked.wait_metric("hearth_waiting_requests", lambda v: v == 1, metrics)
    full = httpx.post(f"{locked.base_url}/chat/completions", headers=auth, json=chat_body(max_tokens=2), timeout=30)
    assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full", full.text
    assert full.json()["error"]["type"] == "rate_limit_error"
    assert int(full.headers["retry-after"]) >= 1
    holder.release()
    waiter.join(600)
    assert waited["r"].status_code == 200, waited["r"].text  # the waiter got the freed slot


def test_a_queue_timeout_is_a_429_with_retry_after(impatient: Server) -> None:
    """The holder cannot end on its own within the waiter's 1 s (HOLD), and it is cancelled only
    after the waiter's 429: `release()` finding it still running proves the slot was held the
    whole time, so the verdict does not depend on the machine's speed."""
    holder = Holder(impatient, "hold-timeout")
    waiting = httpx.post(f"{impatient.base_url}/chat/completions", json=chat_body(max_tokens=2), timeout=120)
    assert waiting.status_code == 429, waiting.text
    assert waiting.json()["error"]["code"] == "queue_timeout" and "within 1 s" in waiting.json()["error"]["message"]
    assert int(waiting.headers["retry-after"]) >= 1
    assert impatient.metric("hearth_waiting_requests") == 0  # it left the queue
    holder.release()


def test_non_loopback_bind_without_a_key_refuses_to_start() -> None:
    r = subprocess.run([sys.executable, "-m", "hearth.cli.main", "serve", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refusing to bind 0.0.0.0" in r.stderr
