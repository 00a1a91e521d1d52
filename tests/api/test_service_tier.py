"""Admission classes and tenants in-process (hearth/engine/fair_share.py, docs/api.md "Fair
shares and priority classes"): `service_tier` and `priority` are checked on every protocol (a
bad value is a 400 in the protocol's own shape), capped by the key's ceiling, echoed as OpenAI
echoes the tier that served a request, and the tenant reaches the engine's fair-share tally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hearth.backends.local.backend import LocalBackend
from hearth.tenants import ApiKey
from tests.api.conftest import Harness, serve

MSGS = [{"role": "user", "content": "hi"}]
CHAT = {"model": "fake", "max_tokens": 3, "messages": MSGS}
COMPLETION = {"model": "fake", "max_tokens": 3, "prompt": "hi"}
RESPONSE = {"model": "fake", "max_output_tokens": 3, "input": "hi"}
MESSAGES = {"model": "fake", "max_tokens": 3, "messages": MSGS}
OLLAMA = {"model": "fake", "messages": MSGS, "stream": False, "options": {"num_predict": 3}}

KEYS = [ApiKey("ka", "alice", "team-a"),  # default class, ceiling default
        ApiKey("ko", "ops", "ops", max_priority="priority"),
        ApiKey("kb", "batch", "batch", priority="flex", weight=0.5)]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/chat/completions", CHAT, "service_tier"), ("/v1/chat/completions", CHAT, "priority"),
    ("/v1/completions", COMPLETION, "service_tier"), ("/v1/responses", RESPONSE, "service_tier"),
    ("/v1/responses", RESPONSE, "priority")])
async def test_an_unknown_class_is_an_openai_400(h: Harness, path: str, body: dict[str, Any], field: str) -> None:
    r = await h.post(path, {**body, field: "urgent"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "flex" in err["message"] and err["type"] == "invalid_request_error"


async def test_an_unknown_class_is_a_400_in_anthropic_and_ollama_shapes(h: Harness) -> None:
    r = await h.post("/v1/messages", {**MESSAGES, "priority": "urgent"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error" and "priority" in r.json()["error"]["message"]
    r = await h.post("/api/chat", {**OLLAMA, "priority": 3})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = await h.post("/v1/chat/completions", {**CHAT, "service_tier": 2})
    assert r.status_code == 400  # not a string: the body's own validation


async def test_the_tier_that_served_it_is_echoed(h: Harness) -> None:
    """A node without keys: any class may be asked for; `auto` is `default`."""
    for asked, echoed in ((None, "default"), ("auto", "default"), ("flex", "flex"), ("priority", "priority")):
        extra = {} if asked is None else {"service_tier": asked}
        r = await h.post("/v1/chat/completions", {**CHAT, **extra})
        assert r.status_code == 200 and r.json()["service_tier"] == echoed
        r = await h.post("/v1/responses", {**RESPONSE, **extra})
        assert r.status_code == 200 and r.json()["service_tier"] == echoed
    # Hearth's own field wins over service_tier
    r = await h.post("/v1/chat/completions", {**CHAT, "service_tier": "flex", "priority": "priority"})
    assert r.json()["service_tier"] == "priority"


async def test_a_key_runs_at_its_default_and_never_above_its_ceiling(tmp_path: Path) -> None:
    async with serve(tmp_path, named_keys=KEYS) as t:
        async def tier(key: str, asked: str | None) -> str:
            extra = {} if asked is None else {"service_tier": asked}
            r = await t.post("/v1/chat/completions", {**CHAT, **extra}, headers=auth(key))
            assert r.status_code == 200, r.text
            return str(r.json()["service_tier"])

        assert await tier("ka", None) == "default"
        assert await tier("ka", "priority") == "default"  # above its ceiling: served as default (OpenAI's way)
        assert await tier("ka", "flex") == "flex"  # lower is always allowed
        assert await tier("ko", "priority") == "priority"
        assert await tier("kb", None) == "flex"  # its key's default class
        assert await tier("kb", "default") == "default"  # up to the default ceiling

        # every request's tokens were charged to its tenant, weights as the key file says
        assert isinstance(t.backend, LocalBackend)
        fair = t.backend._set.loaded()["fake"].admission.fair
        snap = fair.snapshot()
        assert {"team-a", "ops", "batch"} <= snap.keys()
        assert all(snap[name].served > 0 and snap[name].running == 0 for name in ("team-a", "ops", "batch"))
        assert snap["team-a"].admitted == 3 and snap["batch"].admitted == 2
        assert fair._weights["batch"] == 0.5


async def test_metrics_show_each_tenants_share_queue_and_classes(tmp_path: Path) -> None:
    async with serve(tmp_path, named_keys=KEYS) as t:
        for key in ("ka", "ka", "kb"):
            assert (await t.post("/v1/chat/completions", CHAT, headers=auth(key))).status_code == 200
        text = (await t.client.get("/metrics", headers=auth("ka"))).text
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith("hearth_") and " " in line}
    a = lines['hearth_tenant_tokens_served_total{model="fake",tenant="team-a"}']
    b = lines['hearth_tenant_tokens_served_total{model="fake",tenant="batch"}']
    assert a > b > 0
    assert lines['hearth_tenant_token_share{model="fake",tenant="team-a"}'] == pytest.approx(a / (a + b))
    assert lines['hearth_tenant_admitted_requests_total{model="fake",tenant="team-a"}'] == 2
    assert lines['hearth_tenant_queued_requests{model="fake",tenant="batch"}'] == 0
    assert lines['hearth_tenant_preemptions_total{model="fake",tenant="batch"}'] == 0
    assert lines['hearth_queued_requests_by_class{class="flex",model="fake"}'] == 0
    assert lines['hearth_paused_requests_by_class{class="flex",model="fake"}'] == 0
    assert lines['hearth_paused_kv_ram_bytes{model="fake"}'] == lines['hearth_paused_kv_disk_bytes{model="fake"}'] == 0
    assert 'hearth_tenant_wait_seconds_total{model="fake",tenant="team-a"}' in lines


def test_the_work_line_of_ps_and_server_status() -> None:
    from hearth.cli.ps import work_by_class, work_line

    samples = [("hearth_queued_requests_by_class", {"model": "m", "class": "flex"}, 5.0),
               ("hearth_queued_requests_by_class", {"model": "n", "class": "flex"}, 1.0),
               ("hearth_queued_requests_by_class", {"model": "m", "class": "priority"}, 2.0),
               ("hearth_paused_requests_by_class", {"model": "m", "class": "flex"}, 0.0)]
    work = work_by_class(samples)
    assert work == {"queued": {"flex": 6, "priority": 2}, "paused": {}}
    assert work_line(work) == "queued 2 priority, 6 flex; none paused"
