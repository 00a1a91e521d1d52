"""`hearth docs` deciding what goes into the session, against a small fake of the server's API
(sessions, /tokenize at 4 characters a token, chat turns, /metrics) through httpx.MockTransport."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import httpx
import pytest
from rich.console import Console

from hearth.cli.client import Client, CLIError
from hearth.cli.docs import DocsSession
from hearth.retrieval.documents import Document
from hearth.retrieval.prompts import MARK, documents_message, fingerprint


class FakeServer:
    def __init__(self, max_seq_len: int = 4096, sessions_api: bool = True) -> None:
        self.max_seq_len = max_seq_len
        self.sessions_api = sessions_api
        self.sessions: dict[str, list[dict[str, Any]]] = {}
        self.turns: list[dict[str, Any]] = []  # chat bodies, in order
        self.rollbacks: list[int] = []
        self.prefilled = 0

    @staticmethod
    def tokens(messages: list[dict[str, Any]]) -> int:
        return sum(len(m["content"]) // 4 + 4 for m in messages) + 3

    def session(self, sid: str) -> dict[str, Any]:
        msgs = self.sessions[sid]
        return {"object": "session", "session_id": sid, "max_seq_len": self.max_seq_len,
                "current_pos": self.tokens(msgs) if msgs else 0, "message_count": len(msgs)}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        body = json.loads(request.content) if request.content else {}
        if path.startswith("/v1/sessions") and not self.sessions_api:
            return httpx.Response(404, json={"error": {"message": "Unknown endpoint", "code": None}})
        if path == "/v1/sessions" and method == "POST":
            sid = body["session_id"]
            if sid in self.sessions:
                return httpx.Response(409, json={"error": {"message": "exists", "code": "session_exists"}})
            self.sessions[sid] = []
            return httpx.Response(201, json=self.session(sid))
        if m := re.fullmatch(r"/v1/sessions/([^/]+)(/history|/rollback)?", path):
            sid, what = m[1], m[2]
            if what == "/history":
                return httpx.Response(200, json={"object": "list", "data": self.sessions[sid]})
            if what == "/rollback":
                self.rollbacks.append(body["keep_messages"])
                del self.sessions[sid][body["keep_messages"]:]
            return httpx.Response(200, json=self.session(sid))
        if path == "/tokenize":
            n = self.tokens(body["messages"]) if "messages" in body else len(body["content"]) // 4
            return httpx.Response(200, json={"tokens": [], "count": n})
        if path == "/metrics":
            return httpx.Response(200, text=f'hearth_prompt_tokens_total{{model="m"}} {self.prefilled}\n')
        if path == "/v1/chat/completions":
            return self.chat(body)
        return httpx.Response(404, json={"error": {"message": f"no {path}"}})

    def chat(self, body: dict[str, Any]) -> httpx.Response:
        self.turns.append(body)
        history = self.sessions[body["session_id"]]
        cached = self.tokens(history) if history else 0
        history += body["messages"]
        prompt = self.tokens(history)
        if prompt + body["max_tokens"] > self.max_seq_len:
            del history[-len(body["messages"]):]
            return httpx.Response(400, json={"error": {"message": "too long", "code": "context_length_exceeded"}})
        self.prefilled += prompt - cached
        answer = "OK" if body["max_tokens"] == 1 else "It is in the documents [1]."
        history.append({"role": "assistant", "content": answer})
        usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        if not body.get("stream"):
            return httpx.Response(200, json={"choices": [{"message": {"content": answer}}], "usage": usage})
        events = [{"choices": [{"index": 0, "delta": {"content": answer}, "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                  {"choices": [], "usage": usage}]
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})


def session(fake: FakeServer, sid: str = "kb", max_tokens: int = 100) -> tuple[DocsSession, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    client = Client("http://hearth.test", transport=httpx.MockTransport(fake))
    ds = DocsSession(client, Console(file=out, width=200), Console(file=err, width=200), None, sid, max_tokens,
                     0.0, 3)
    return ds, out, err


DOCS = [Document("kb/kiln.md", "# Kiln\n\nThe kiln is called Ember-7.\n"),
        Document("kb/bake.py", "def bake(loaf):\n    return loaf\n")]


def many_docs(n: int = 12) -> list[Document]:
    return [Document(f"kb/{i:02d}.md", "\n".join(f"Line {j} of file {i} about topic{i} and more words here."
                                                   for j in range(60))) for i in range(n)]


def test_documents_that_fit_are_prefilled_once_then_found_again() -> None:
    fake = FakeServer()
    ds, _, err = session(fake)
    ds.prepare(DOCS, chunk_tokens=200, retrieve=False)
    assert ds.whole and ds.base == 2
    (turn,) = fake.turns
    assert turn["messages"] == [{"role": "user", "content": documents_message(DOCS)}]
    assert turn["max_tokens"] == 1 and turn["session_id"] == "kb"
    assert "ingested 2 files into session kb" in err.getvalue()

    again, _, err2 = session(fake)
    again.prepare(DOCS, chunk_tokens=200, retrieve=False)
    assert len(fake.turns) == 1, "nothing prefilled the second time"
    assert "already in session kb" in err2.getvalue()

    again.ask("What is the kiln called?")
    assert fake.turns[-1]["messages"] == [{"role": "user", "content": "What is the kiln called?"}]
    assert fake.sessions["kb"][0]["content"].startswith(f"{MARK} {fingerprint(DOCS)}:")


def test_changed_documents_replace_the_old_ones() -> None:
    fake = FakeServer()
    session(fake)[0].prepare(DOCS, chunk_tokens=200, retrieve=False)
    changed = [DOCS[0], Document("kb/bake.py", "def bake(loaf, minutes=40):\n    return loaf\n")]
    ds, _, err = session(fake)
    ds.prepare(changed, chunk_tokens=200, retrieve=False)
    assert fake.rollbacks == [0] and "documents changed" in err.getvalue()
    assert fake.sessions["kb"][0]["content"] == documents_message(changed)


def test_documents_that_do_not_fit_are_retrieved_within_the_budget() -> None:
    fake = FakeServer(max_seq_len=1024)
    ds, out, err = session(fake)
    ds.prepare(many_docs(), chunk_tokens=60, retrieve=False)
    assert not ds.whole and fake.turns == [], "nothing is prefilled when retrieving"
    assert "more than session kb holds (1024 tokens)" in err.getvalue()

    ds.ask("What does line 7 of file 5 say about topic5?")
    (turn,) = fake.turns
    content = turn["messages"][0]["content"]
    cites = re.findall(r"^\[(\d+)\] (\S+):(\d+)-(\d+)$", content, re.M)
    assert cites and cites[0][1] == "kb/05.md", "the best passage comes first"
    assert all(path == "kb/05.md" for _, path, _, _ in cites)
    assert fake.tokens(turn["messages"]) + 100 <= 1024, "passages fit the session"
    printed = out.getvalue().split("Sources:")[1]
    assert [ln.strip().split("  ")[0] for ln in printed.strip().splitlines()] == [
        f"[{n}] {p}:{a}-{b}" for n, p, a, b in cites]
    assert "[1] kb/05.md" in printed and "(cited)" in printed  # the fake's answer cites [1]


def test_retrieval_rolls_back_when_the_conversation_leaves_no_room() -> None:
    fake = FakeServer(max_seq_len=1024)
    ds, _, _ = session(fake)
    ds.prepare(many_docs(), chunk_tokens=60, retrieve=True)
    for _ in range(6):
        ds.ask("What about topic3 and topic7?")
    assert 0 in fake.rollbacks, "old questions were dropped to make room"
    assert len(fake.turns) == 6 and fake.tokens(fake.sessions["kb"]) <= 1024


def test_whole_documents_keep_the_documents_when_questions_fill_the_session() -> None:
    fake = FakeServer(max_seq_len=420)
    ds, _, _ = session(fake, max_tokens=40)
    ds.prepare(DOCS, chunk_tokens=200, retrieve=False)
    assert ds.whole
    for _ in range(10):
        ds.ask("What is the kiln called, and what does bake return? Please answer fully.")
    assert fake.rollbacks and set(fake.rollbacks) == {2}, "rolled back to the documents and their reply"
    assert fake.sessions["kb"][0]["content"] == documents_message(DOCS)


def test_foreign_sessions_and_servers_without_sessions_are_refused() -> None:
    fake = FakeServer()
    fake.sessions["chat"] = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    with pytest.raises(CLIError, match="holds another conversation"):
        session(fake, "chat")[0].prepare(DOCS, chunk_tokens=200, retrieve=False)
    with pytest.raises(CLIError, match="no sessions API"):
        session(FakeServer(sessions_api=False))[0].prepare(DOCS, chunk_tokens=200, retrieve=False)


def test_slash_commands_are_not_questions() -> None:
    out, err = io.StringIO(), io.StringIO()
    ds = DocsSession(Client("http://unused"), Console(file=out, width=200), Console(file=err, width=200), None,
                     "docs-x", 16, 0.0, 4, docs=[Document("a.md", "one\ntwo\n")], last_sources=["[1] a.md:2"])
    assert ds.command("/QUIT") and ds.command("/exit")
    assert not ds.command("/help") and "/sources" in out.getvalue()
    assert not ds.command("/sources")
    assert "1 documents in session docs-x (whole):" in out.getvalue() and "a.md (2 lines)" in out.getvalue()
    assert "[1] a.md:2" in out.getvalue()
    assert not ds.command("/what") and "unknown command /what" in err.getvalue()
