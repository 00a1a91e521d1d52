"""Text between and around calls: whitespace that only separates calls is not content."""

from __future__ import annotations

from hearth.chat.tool_parsers.base import Part


class TextOut:
    """Emits text with its trailing whitespace held back: dropped if a call follows, kept if
    more text does. Text right after a call loses its leading whitespace."""

    def __init__(self) -> None:
        self._ws = ""
        self._after_call = False

    def text(self, out: list[Part], s: str) -> None:
        if not s:
            return
        t = self._ws + s
        if self._after_call:
            t = t.lstrip()
        body = t.rstrip()
        self._ws = t[len(body):]
        if body:
            self._after_call = False
            out.append(body)

    def call(self) -> None:
        self._ws = ""
        self._after_call = True

    def finish(self, out: list[Part], n_calls: int) -> None:
        if self._ws and not n_calls:
            out.append(self._ws)
        self._ws = ""
