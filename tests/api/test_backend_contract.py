"""The app over a backend written here, with no engine, runner or model: everything above
`backends/` works through the contract alone (chat, sessions and snapshots, metrics), and a
backend without the session-KV capability gets one clear error everywhere sessions appear, and
one without a prompt cache a clear 404 on the prompt-cache routes (and no cache series)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from hearth.backends.base import (
    Backend,
    Embeddings,
    EventStream,
    KVIdentity,
    KVInfo,
    KVState,
    ModelCard,
    ModelLimits,
    ModelLoading,
    ModelStats,
    PromptCache,
    SessionKV,
)
from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    CompletionRequest,
    Done,
    Finish,
    Message,
    Started,
    TextDelta,
    Usage,
)
from hearth.errors import Conflict, NotFound
from tests.api.conftest import serve
from tests.helpers import sample


class EchoKV:
    """Session KV kept as the prompt's character codes (what a remote node would hold)."""

    def __init__(self) -> None:
        self.kv: dict[str, KVState] = {}
        self.busy: set[str] = set()

    async def kv_info(self, model: str, session_id: str) -> KVInfo:
        state = self.kv.get(session_id)
        return KVInfo("resident", len(state.tokens)) if state else KVInfo("none", 0)

    async def export_kv(self, model: str, session_id: str) -> KVState | None:
        return self.kv.get(session_id)

    async def import_kv(self, model: str, session_id: str, state: KVState) -> None:
        if session_id in self.busy:
            raise Conflict("busy", code="session_busy")
        self.kv[session_id] = state

    async def drop_kv(self, model: str, session_id: str) -> None:
        self.kv.pop(session_id, None)

    async def trim_kv(self, model: str, session_id: str, tokens: list[int]) -> int:
        state = self.kv.get(session_id)
        if state is None:
            return 0
        n = next((i for i, (a, b) in enumerate(zip(state.tokens, tokens, strict=False)) if a != b),
                 min(len(state.tokens), len(tokens)))
        self.kv[session_id] = KVState(state.tokens[:n], state.data)
        return n

    async def kv_identity(self, model: str) -> KVIdentity:
        return KVIdentity({"id": model, "sha256": "ec" * 32}, {"engine": "echo", "kv_type": "chars"})

    async def max_kv_bytes(self, model: str) -> int:
        return 4 * 1024


class EchoBackend:
    """Replies with the last message, reversed. One model, "echo"."""

    def __init__(self, with_sessions: bool = True) -> None:
        self._kv = EchoKV() if with_sessions else None
        self.stats_ = ModelStats()
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def load_error(self) -> str | None:
        return None

    async def start(self) -> None:
        self._ready = True

    async def stop(self) -> None:
        self._ready = False

    def cancel_all(self) -> None:
        pass

    def models(self) -> list[ModelCard]:
        return [ModelCard("echo", 0, owned_by="test")]

    def resolve(self, model: str | None) -> str:
        if model not in (None, "", "echo"):
            raise NotFound(f"The model '{model}' does not exist", param="model", code="model_not_found")
        return "echo"

    def limits(self, model: str | None) -> ModelLimits:
        return ModelLimits(seq_ctx=4096, parallel=1)

    def _prompt(self, messages: list[Message]) -> list[int]:
        return [ord(c) for m in messages for c in f"{m.role}:{m.content}\n"]

    async def chat(self, req: ChatRequest) -> EventStream:
        self.resolve(req.model)
        prompt = self._prompt(req.messages)
        reply = (req.messages[-1].content or "")[::-1]
        kv = self._kv
        cached = 0
        if req.session is not None and kv is not None:
            had = kv.kv.get(req.session.session_id)
            cached = len(had.tokens) if had and prompt[:len(had.tokens)] == had.tokens else 0
            kv.kv[req.session.session_id] = KVState(prompt + self._prompt([Message("assistant", reply)]), b"chars")
        self.stats_.prompt_tokens += len(prompt) - cached
        self.stats_.cached_tokens += cached
        self.stats_.generated_tokens += len(reply)

        async def events() -> AsyncIterator[ChatEvent]:
            yield Started(len(prompt), cached)
            yield TextDelta(0, reply, n_tokens=len(reply))
            yield Finish(0, "stop")
            yield Done(Usage(len(prompt), len(reply), cached))

        return EventStream(events())

    async def complete(self, req: CompletionRequest) -> EventStream:
        return await self.chat(ChatRequest(req.model, [Message("user", str(req.prompt))]))

    async def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]:
        return [ord(c) for c in text]

    async def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]:
        return self._prompt(messages)

    async def tokenize_prompt(self, req: ChatRequest) -> list[int]:
        return self._prompt(req.messages)

    async def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]:
        return [chr(t) for t in tokens]

    async def detokenize(self, model: str | None, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens)

    def stats(self) -> dict[str, ModelStats]:
        return {"echo": self.stats_}

    @property
    def session_kv(self) -> SessionKV | None:
        return self._kv

    @property
    def prompt_cache(self) -> PromptCache | None:
        return None

    @property
    def model_loading(self) -> ModelLoading | None:
        return None

    @property
    def embeddings(self) -> Embeddings | None:
        return None


def conforms(backend: Backend) -> Backend:
    return backend  # mypy checks the structural match; at runtime the app does


async def test_chat_sessions_snapshots_and_metrics_through_the_contract(tmp_path: Path) -> None:
    backend = EchoBackend()
    async with serve(tmp_path, backend=conforms(backend)) as h:
        r = await h.post("/v1/chat/completions", {"model": "echo", "messages": [{"role": "user", "content": "abc"}]})
        assert r.json()["choices"][0]["message"]["content"] == "cba"
        events = await h.sse("/v1/messages", {"model": "echo", "max_tokens": 9,
                                              "messages": [{"role": "user", "content": "xyz"}]})
        assert [d["delta"]["text"] for e, d in events if e == "content_block_delta"] == ["zyx"]
        for word in ("one", "two"):
            r = await h.post("/v1/chat/completions", {"model": "echo", "session_id": "s",
                                                      "messages": [{"role": "user", "content": word}]})
            assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == len("user:one\nassistant:eno\n")
        info = (await h.client.get("/v1/sessions/s")).json()
        assert info["residency"] == "resident" and info["message_count"] == 4
        assert info["current_pos"] == len("user:one\nassistant:eno\nuser:two\nassistant:owt\n")
        snap = (await h.post("/v1/sessions/s/save")).json()
        assert snap["engine"] == {"engine": "echo", "kv_type": "chars"}
        loaded = await h.post(f"/v1/snapshots/{snap['snapshot_id']}/load", {"session_id": "t"})
        assert loaded.status_code == 201 and loaded.json()["current_pos"] == info["current_pos"], loaded.text
        assert backend._kv is not None and backend._kv.kv["t"] == backend._kv.kv["s"]
        resized = await h.post("/v1/sessions/s/resize", {"max_seq_len": 30, "strategy": "drop_oldest"})
        # 46 characters of transcript; the oldest two go to fit under 30 (counted by the backend)
        assert resized.json()["message_count"] == 2
        assert (await h.post("/v1/messages/count_tokens", {"model": "echo", "messages": [
            {"role": "user", "content": "hi"}]})).json() == {"input_tokens": len("user:hi\n")}
        metrics = (await h.client.get("/metrics")).text
        assert sample(metrics, 'hearth_generated_tokens_total{model="echo"}') == backend.stats_.generated_tokens
        assert sample(metrics, 'hearth_cached_tokens_total{model="echo"}') > 0
        assert (await h.client.delete("/v1/sessions/s")).status_code == 200
        assert "s" not in backend._kv.kv


async def test_a_backend_without_session_kv_answers_one_clear_error(tmp_path: Path) -> None:
    async with serve(tmp_path, backend=EchoBackend(with_sessions=False)) as h:
        assert (await h.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "ok"}]})).json()[
            "choices"][0]["message"]["content"] == "ko"
        calls = [h.client.get("/v1/sessions"), h.client.get("/v1/sessions/s"), h.client.post("/v1/sessions"),
                 h.client.get("/v1/snapshots"), h.client.post("/v1/snapshots/snap_" + "0" * 32 + "/load"),
                 h.post("/v1/chat/completions", {"session_id": "s", "messages": [{"role": "user", "content": "x"}]}),
                 h.post("/v1/responses", {"session_id": "s", "input": "x"})]
        for call in calls:
            r = await call
            assert r.status_code == 404 and r.json()["error"]["code"] == "sessions_unsupported", r.text
        r = await h.post("/v1/messages", {"session_id": "s", "max_tokens": 5, "messages": [
            {"role": "user", "content": "x"}]})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


async def test_a_backend_without_a_prompt_cache_answers_one_clear_error(tmp_path: Path) -> None:
    async with serve(tmp_path, backend=conforms(EchoBackend())) as h:
        for method, path in (("GET", "/admin/prompt-cache"), ("GET", "/admin/prompt-cache/entries"),
                             ("DELETE", "/admin/prompt-cache"), ("GET", "/v1/prompt-cache/digest")):
            r = await h.client.request(method, path)
            assert r.status_code == 404, r.text
            assert r.json()["error"]["code"] == "prompt_cache_unsupported" and r.json()["error"]["type"] == \
                "not_found_error"
        metrics = (await h.client.get("/metrics")).text
        assert "hearth_running_sequences" in metrics and "hearth_prompt_cache" not in metrics
