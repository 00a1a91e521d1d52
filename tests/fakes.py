"""Stand-ins shared by the unit and in-process API tests: a runner that answers every chat
prompt with a scripted reply, and a LocalBackend built on it (no model, no port)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hearth.backends.base import ModelCard
from hearth.backends.local.backend import LocalBackend
from hearth.backends.local.model import EngineSettings
from hearth.chat.template import ChatTemplate
from hearth.engine.fake_runner import EOS, FakeRunner
from hearth.engine.runner import BatchEntry
from hearth.models import ModelSpec

SMOL = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
REPLY_MARK = b"assistant\n"


@dataclass
class ScriptedRunner(FakeRunner):
    """Answers every prompt with `answer` (bytes), then EOS: the reply is found by its offset
    from the end of the prompt, which ends with the assistant header.

    `gate`, when set, holds every decode until it is opened (`entered` is set by the first
    decode that waits), so a test can act while a run is inside the engine without sleeping.
    With `gate_generating`, only a decode of generated tokens waits (one whose sequence's KV
    ends with the assistant header: the decode right after the first token), not the prompt's.
    `hold_tokenize`, when set, holds `tokenize` the same way."""

    answer: bytes = b""
    gate: threading.Event | None = None
    gate_generating: bool = False
    entered: threading.Event = field(default_factory=threading.Event)
    hold_tokenize: threading.Event | None = None
    tokenizing: threading.Event = field(default_factory=threading.Event)

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        if self.hold_tokenize is not None:
            self.tokenizing.set()
            assert self.hold_tokenize.wait(30), "the test never released tokenize"
        return list(text.encode())

    def decode(self, entries: list[BatchEntry]) -> list[int]:
        if self.gate is not None and (not self.gate_generating or any(
                bytes(t for t in self.kv.get(e.seq_id, []) if t < 256).endswith(REPLY_MARK) for e in entries)):
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
        return super().decode(entries)

    def next_token(self, seq: list[int]) -> int:
        text = bytes(t for t in seq if t < 256)
        k = len(text) - text.rfind(REPLY_MARK) - len(REPLY_MARK)
        return self.answer[k] if k < len(self.answer) else EOS


def scripted_backend(answer: str = "", template: str = SMOL, *, parallel: int = 2, n_ctx: int = 2048,
                     path: Path = Path("fake.gguf"), **runner_kw: Any) -> tuple[LocalBackend, ScriptedRunner]:
    """A LocalBackend over one ScriptedRunner (not started). `path` stands for the weights
    file: snapshots hash it, so it must exist where they are used."""
    runner = ScriptedRunner(n_seq_max=parallel, n_batch=64, **runner_kw)
    runner.answer = answer.encode()

    def factory(spec: ModelSpec, settings: EngineSettings) -> Any:
        return runner, ModelCard(spec.id, 0, meta={"n_ctx": n_ctx, "parallel": parallel}), ChatTemplate(template)

    backend = LocalBackend([ModelSpec("fake", path)], EngineSettings(parallel=parallel, batch=64),
                           factory)
    return backend, runner
