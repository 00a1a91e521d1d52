"""The node side of joining (`hearth serve --join`, cli/join.py), against a fake gateway: it
registers, renews as often as the gateway says, retries while refused, leaves when stopped."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from hearth.cli.join import Joiner, advertise_url, node_name
from tests.helpers import wait_until


class FakeGateway:
    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.calls: list[tuple[str, str, dict[str, object] | None, str | None]] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        with self.lock:
            self.calls.append((request.method, request.url.path, body, request.headers.get("authorization")))
        if request.method == "DELETE":
            return httpx.Response(200, json={"removed": True})
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "no"}})
        return httpx.Response(200, json={"name": "n1", "renew_every": 0.01})

    def count(self, method: str) -> int:
        with self.lock:
            return sum(1 for c in self.calls if c[0] == method)


def test_it_registers_renews_and_leaves() -> None:
    gw = FakeGateway()
    j = Joiner("http://gw.test:8080/", "jk", "n1", "http://n1:8000",
               {"kind": "hearth", "models": {"m": "m"}, "max_in_flight": 2}, transport=httpx.MockTransport(gw))
    j.start()
    wait_until(lambda: gw.count("POST") >= 3, "three renewals")
    j.stop()
    method, path, body, auth = gw.calls[0]
    assert (method, path, auth) == ("POST", "/admin/fleet/join", "Bearer jk")
    assert body == {"name": "n1", "url": "http://n1:8000", "kind": "hearth", "models": {"m": "m"}, "max_in_flight": 2}
    assert gw.calls[-1][:2] == ("DELETE", "/admin/fleet/n1") and gw.count("DELETE") == 1


def test_a_refused_node_keeps_trying_and_never_leaves_what_it_never_joined(caplog: pytest.LogCaptureFixture) -> None:
    gw = FakeGateway(status=403)
    j = Joiner("http://gw.test:8080", "wrong-key", "n1", "http://n1:8000", {}, transport=httpx.MockTransport(gw))
    j.renew()
    j.renew()
    j.stop()
    assert gw.count("POST") == 2 and gw.count("DELETE") == 0 and not j.joined.is_set()
    assert caplog.text.count("refused the registration") == 1 and "wrong-key" not in caplog.text


def test_names_and_urls() -> None:
    assert node_name("hearth-0") == "hearth-0"
    with pytest.raises(ValueError):
        node_name("a/b")
    assert advertise_url(None, "127.0.0.1", 8001) == "http://127.0.0.1:8001"
    assert advertise_url("https://n.example/", "0.0.0.0", 1) == "https://n.example"
    assert advertise_url(None, "0.0.0.0", 8000).endswith(":8000")
    with pytest.raises(ValueError):
        advertise_url("n:8000", "127.0.0.1", 1)
    with pytest.raises(ValueError):
        Joiner("gw:8080", None, "n", "http://n:1", {})
