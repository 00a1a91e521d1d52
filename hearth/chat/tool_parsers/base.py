"""What every tool-call parser shares: the streaming interface, partial-marker holdback and an
incremental reader for one call written as a JSON object.

A parser is fed the model's text in arbitrary pieces (one character or the whole output) and
returns parts: plain text, or `CallPart`s (a call announced with its name, then argument text).
Invariants: a prefix of a marker is held back until it completes or cannot, so it is never
streamed as text; fed the same text in any split, a parser returns the same parts once joined;
malformed calls come back as text (or, in the hermes parser, as a `BadCall`), never as an
exception.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

from hearth.chat.types import Tool
from hearth.engine.detokenizer import held_prefix


@dataclass(slots=True)
class CallPart:
    """Part of call number `call_index`: `name` is set once, on the part that announces it."""

    call_index: int
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class BadCall:
    """Call number `call_index` could not be read (SIE's contract: the run ends with a clear
    finish and a message naming the call, and the markup never becomes text). `name` is set
    when the call had been announced; `text` is what the model wrote for it."""

    call_index: int
    name: str | None
    text: str
    problem: str


Part = str | CallPart | BadCall


class ToolParser(ABC):
    """Incremental parser for one candidate's output."""

    name: str = ""
    bare_json_native = False  # its own format is a bare JSON object (see lenient.py)

    def __init__(self, tools: list[Tool]) -> None:
        self.tools = {t.name: t for t in tools}
        self.n_calls = 0
        self._buf = ""  # text received and not yet resolved into parts

    def feed(self, text: str) -> list[Part]:
        out: list[Part] = []
        self._buf += text
        self._run(out)
        return out

    @abstractmethod
    def _run(self, out: list[Part]) -> None:
        """Turn as much of `self._buf` into parts as is safe now, holding back the rest."""

    @abstractmethod
    def finish(self) -> list[Part]:
        """The output ended: resolve whatever is still held back."""


class JsonCallParser(ToolParser):
    """A parser whose calls are JSON objects read by one `JsonCall` at a time."""

    def __init__(self, tools: list[Tool]) -> None:
        super().__init__(tools)
        self._call: JsonCall | None = None

    def _feed_call(self, out: list[Part]) -> JsonCall:
        """Feed the whole buffer to the open call; once it is complete, its closing parts too.
        The caller looks at `done`, `failed` and `rest` to decide what comes next."""
        call = self._call
        assert call is not None
        out.extend(call.feed(self._buf))
        self._buf = ""
        if call.done:
            out.extend(call.finish_parts())
        return call

    def _end_call(self, out: list[Part]) -> JsonCall:
        """The output ended inside a call: emit what its arguments still owe."""
        call = self._call
        assert call is not None
        out.extend(call.finish_parts())
        return call


def split_at_marker(buf: str, marker: str) -> tuple[str, bool, str]:
    """(text safe to emit, whether the marker was found, what follows it / what is held)."""
    i = buf.find(marker)
    if i >= 0:
        return buf[:i], True, buf[i + len(marker):]
    keep = held_prefix(buf, (marker,))
    return buf[:len(buf) - keep], False, buf[len(buf) - keep:]


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class JsonCall:
    """One call written as `{"name": ..., "arguments"|"parameters": {...}}` (or, with `name`
    given, just the arguments object). The name is announced as soon as it is read and the
    arguments object streams as it arrives; keys in another order are read whole at the end.

    `feed` returns parts; `done` is set when the outer object closes, `rest` is the text after
    it; `failed` when the text cannot be a call (then `text` is everything it was fed)."""

    def __init__(self, call_index: int, name: str | None = None) -> None:
        self.call_index = call_index
        self.text = ""
        self.done = False
        self.failed = False
        self.rest = ""
        self._fixed_name = name
        self._name = name
        self._announced = False
        self._args_start: int | None = None  # index of the arguments' opening brace
        self._args_end: int | None = None
        self._emitted = 0
        self._pos = 0
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._end: int | None = None
        self._whole_args = ""

    @property
    def announced(self) -> bool:
        return self._announced

    @property
    def name(self) -> str | None:
        return self._name

    def feed(self, text: str) -> list[Part]:
        if self.done or self.failed:
            self.rest += text
            return []
        self.text += text
        if self._args_start is None:
            self._find_arguments()
            if self.failed:
                return []
        self._scan()
        return self._emit()

    def _find_arguments(self) -> None:
        stripped = self.text.lstrip()
        if stripped and stripped[0] != "{":
            self.failed = True
            return
        if self._fixed_name is not None:
            if stripped:
                self._args_start = len(self.text) - len(stripped)
            return
        m = _HEAD.match(self.text)
        if m is None:
            return
        after = self.text[m.end():]
        if not after:
            return
        if after[0] != "{":  # arguments that are not an object: read the whole call at the end
            self._args_start = -1
            return
        try:
            self._name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            self._args_start = -1
            return
        self._args_start = m.end()

    def _scan(self) -> None:
        # Only the outermost object's depth matters: track strings so braces in them are ignored.
        inner = 1 if self._fixed_name is None else 0  # depth of the arguments object's contents
        t = self.text
        while self._pos < len(t) and self._end is None:
            c = t[self._pos]
            self._pos += 1
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
            elif c == '"':
                self._in_str = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if (self._args_end is None and self._args_start is not None and self._args_start >= 0
                        and self._pos > self._args_start and self._depth == inner):
                    self._args_end = self._pos
                if self._depth <= 0:
                    self._end = self._pos
        if self._end is not None:
            self.done = True
            self.rest = t[self._end:]
            self.text = t[:self._end]
            if self._args_start is None or self._args_start < 0:
                self._read_whole()

    def _emit(self) -> list[Part]:
        parts: list[Part] = []
        if self.failed or self._args_start is None or self._args_start < 0:
            return parts
        if not self._announced:
            assert self._name is not None
            self._announced = True
            self._emitted = self._args_start
            parts.append(CallPart(self.call_index, self._name))
        limit = self._args_end if self._args_end is not None else self._pos
        if limit > self._emitted:
            parts.append(CallPart(self.call_index, None, self.text[self._emitted:limit]))
            self._emitted = limit
        return parts

    def _read_whole(self) -> None:
        """Keys in another order, or arguments that are not an object: parse the finished text."""
        try:
            obj = json.loads(self.text)
        except ValueError:
            self.failed = True
            return
        if self._fixed_name is not None:
            self._name, args = self._fixed_name, obj
        elif isinstance(obj, dict) and isinstance(obj.get("name"), str):
            self._name = obj["name"]
            args = obj.get("arguments", obj.get("parameters", {}))
        else:
            self.failed = True
            return
        if isinstance(args, str):  # arguments given as JSON text
            self._whole_args = args
        else:
            self._whole_args = json.dumps(args, ensure_ascii=False)

    def finish_parts(self) -> list[Part]:
        """Parts still owed once the call is done (a call read whole), or at the end of output."""
        if self.failed:
            return []
        if self.done and (self._args_start is None or self._args_start < 0):
            self._announced = True
            return [CallPart(self.call_index, self._name), CallPart(self.call_index, None, self._whole_args)]
        if not self.done and not self._announced:
            self.failed = True
        # Announced but unfinished (cut off by max_tokens, or no closing brace): the call stands
        # with the arguments streamed so far; they cannot be taken back.
        return []
