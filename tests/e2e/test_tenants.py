"""Tenants on a real server with the real model (docs/api.md, "Keys and tenants"): a key file
with two tenants (one of them with two keys) and an admin key. Each tenant sees exactly its own
sessions, snapshots and stored responses through the official SDK and raw HTTP; a prefix one
tenant sent is never reported cached for the other."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hearth.tenants import session_prefix
from tests.helpers import Server, start_server, stop_server

pytestmark = pytest.mark.slow

ALICE, ALICE_CI, BOB, ADMIN = "sk-alice", "sk-alice-ci", "sk-bob", "sk-admin"
# Longer than one 256-token block of the prompt cache, so its reuse is unmistakable.
SYSTEM = {"role": "system", "content": "You are a careful assistant who answers in one short sentence. " * 20}
Q = {"role": "user", "content": "Name a color."}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tenants")
    keys = tmp / "keys.txt"
    keys.write_text(f"# test keys\n{ALICE} name=alice tenant=team-a\n{ALICE_CI} name=alice-ci tenant=team-a\n"
                    f"{BOB} name=bob\n")
    s = start_server(tmp, "--api-key-file", str(keys), "--admin-key", ADMIN, "--parallel", "4", "--ctx", "2048")
    yield s
    stop_server(s)


def oai(s: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key=key, timeout=600, max_retries=0)


def get(s: Server, path: str, key: str) -> httpx.Response:
    return httpx.get(f"{s.base_url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=60)


def chat(s: Server, key: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
    with oai(s, key) as c:
        return c.chat.completions.create(model="default", messages=messages, temperature=0,  # type: ignore[arg-type]
                                         max_tokens=4, extra_body=extra)


def test_each_tenant_sees_exactly_its_own(srv: Server) -> None:
    chat(srv, ALICE, [Q], session_id="alice-chat")
    snap = httpx.post(f"{srv.base_url}/sessions/alice-chat/save", json={}, timeout=60,
                      headers={"Authorization": f"Bearer {ALICE}"}).json()["snapshot_id"]
    with oai(srv, ALICE) as c:
        resp = c.responses.create(model="default", input="Name a fruit.", max_output_tokens=4)

    for path in ("/sessions/alice-chat", "/sessions/alice-chat/history", f"/snapshots/{snap}",
                 f"/snapshots/{snap}/archive", f"/responses/{resp.id}"):
        for key in (ALICE, ALICE_CI):
            assert get(srv, path, key).status_code == 200, (path, key)
        # the admin names alice's session by its stored id: a tenant's ids are its own namespace
        assert get(srv, path.replace("/alice-chat", "/" + session_prefix("team-a") + "alice-chat"),
                   ADMIN).status_code == 200, path
        theirs = get(srv, path, BOB)
        assert theirs.status_code == 404, (path, theirs.text)
    assert [s["session_id"] for s in get(srv, "/sessions", BOB).json()["data"]] == []
    assert get(srv, "/snapshots", BOB).json()["data"] == []
    assert [s["session_id"] for s in get(srv, "/sessions", ALICE_CI).json()["data"]] == ["alice-chat"]

    with oai(srv, BOB) as c:  # the SDK's own errors: not found, as for an id that never existed
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(resp.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.create(model="default", input="And another?", previous_response_id=resp.id,
                               max_output_tokens=4)
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="default", messages=[Q], max_tokens=4,  # type: ignore[list-item]
                                      extra_body={"session_id": "alice-chat", "session_create": False})
    with oai(srv, ALICE_CI) as c:  # the same tenant, another key: continues both
        follow = c.responses.create(model="default", input="And another?", previous_response_id=resp.id,
                                    max_output_tokens=4)
        assert follow.previous_response_id == resp.id and follow.status in ("completed", "incomplete")
    assert len(get(srv, "/sessions/alice-chat/history", ALICE).json()["data"]) == 2  # nothing of bob's


def test_a_prefix_is_never_cached_for_another_tenant(srv: Server) -> None:
    first = chat(srv, ALICE, [SYSTEM, Q])
    theirs = chat(srv, BOB, [SYSTEM, Q])
    assert theirs.usage.prompt_tokens_details.cached_tokens == 0  # bob's namespace holds nothing yet
    mine = chat(srv, ALICE_CI, [SYSTEM, Q])
    assert mine.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
