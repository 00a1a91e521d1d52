"""The input JSONL of a batch: one request per line, `{custom_id, method, url, body}` (OpenAI's
format). Every line is checked when the file is uploaded, and the error names its line number
(1-based, as an editor shows it); the batch's `endpoint` is checked against every line's `url`
when the batch is created. A duplicate `custom_id` is an error: the output is matched to the
input by it, and the runner's resume record is keyed by it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hearth import jsonsafe
from hearth.errors import BadRequest

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
MAX_LINES = 50_000  # OpenAI's limit of requests per batch
MAX_CUSTOM_ID = 512
# Fields a batch line may not set: its answer is one JSON body, and the runner owns the run.
REFUSED_TRUE = ("stream", "background")


@dataclass(frozen=True, slots=True)
class Line:
    index: int  # 0-based position in the file
    custom_id: str
    url: str
    body: dict[str, Any]


def line_error(n: int, message: str, param: str | None = None) -> BadRequest:
    return BadRequest(f"line {n}: {message}", param=param, code="invalid_batch_line")


def parse_line(n: int, raw: bytes) -> Line:
    """Line `n` (1-based) of an input file, checked."""
    try:
        obj = jsonsafe.loads(raw)
    except jsonsafe.JSONRejected as e:
        raise line_error(n, f"not acceptable JSON: {e}") from e
    if not isinstance(obj, dict):
        raise line_error(n, "each line must be a JSON object {custom_id, method, url, body}")
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise line_error(n, f"unknown field {unknown[0]!r}", unknown[0])
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID:
        raise line_error(n, f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters", "custom_id")
    if obj.get("method") != "POST":
        raise line_error(n, "method must be \"POST\"", "method")
    url = obj.get("url")
    if url not in ENDPOINTS:
        raise line_error(n, f"url must be one of {', '.join(ENDPOINTS)}", "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise line_error(n, "body must be a JSON object (the request the url takes)", "body")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise line_error(n, "body.model must name a model", "body.model")
    for key in REFUSED_TRUE:
        if body.get(key) is True:
            raise line_error(n, f"body.{key} is not supported in a batch", f"body.{key}")
    return Line(n - 1, cid, str(url), body)


class Splitter:
    """A file's lines as its bytes come, piece by piece, split on b"\\n" as `bytes.split` would
    (the text after the last newline is a line too, maybe empty), numbered from 1. Holds the
    line being completed as its pieces (joined once: a line longer than many pieces is not
    re-copied per piece)."""

    def __init__(self) -> None:
        self.n = 0
        self._pending: list[bytes] = []

    def feed(self, piece: bytes) -> Iterator[tuple[int, bytes]]:
        start = 0
        while (end := piece.find(b"\n", start)) >= 0:
            self._pending.append(piece[start:end])
            self.n += 1
            yield self.n, b"".join(self._pending)
            self._pending, start = [], end + 1
        if start < len(piece):
            self._pending.append(piece[start:])

    def end(self) -> tuple[int, bytes]:
        """The last line (after the last newline)."""
        self.n += 1
        last, self._pending = b"".join(self._pending), []
        return self.n, last


class FileCheck:
    """`parse_file`'s checks over a file's lines as they come (`line` for each, then `end`):
    the same errors with the same line numbers. Keeps the custom_ids seen, not the lines."""

    def __init__(self) -> None:
        self.count = 0
        self._seen: set[str] = set()

    def line(self, n: int, raw: bytes) -> Line | None:
        """Line `n` (1-based) checked; None for a blank one."""
        if not raw.strip():
            return None
        if self.count >= MAX_LINES:
            raise line_error(n, f"a batch holds at most {MAX_LINES} requests")
        line = parse_line(n, raw)
        if line.custom_id in self._seen:
            raise line_error(n, f"duplicate custom_id {line.custom_id!r}", "custom_id")
        self._seen.add(line.custom_id)
        self.count += 1
        return Line(self.count - 1, line.custom_id, line.url, line.body)

    def end(self) -> int:
        """The number of requests, or the error of a file without one."""
        if not self.count:
            raise BadRequest("the file holds no requests", param="file", code="invalid_batch_line")
        return self.count


def check_pieces(pieces: Iterable[bytes]) -> tuple[int, int]:
    """Every line of a file given piece by piece checked as `parse_file` does; (requests,
    bytes). Holds one piece and one line."""
    check, split, size = FileCheck(), Splitter(), 0
    for piece in pieces:
        size += len(piece)
        for n, raw in split.feed(piece):
            check.line(n, raw)
    check.line(*split.end())
    return check.end(), size


def parse_file(content: bytes) -> list[Line]:
    """Every line of an input file (blank lines skipped), or the first error with its line number."""
    check = FileCheck()
    out = [line for n, raw in enumerate(content.split(b"\n"), start=1) if (line := check.line(n, raw)) is not None]
    check.end()
    return out


def line_number(content: bytes, index: int) -> int:
    """The 1-based line number in `content` of request `index` (blank lines counted)."""
    k = -1
    for n, raw in enumerate(content.split(b"\n"), start=1):
        if raw.strip():
            k += 1
            if k == index:
                return n
    return 0


def dumps(obj: Any) -> bytes:
    """One JSONL line (compact, UTF-8, newline-terminated)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
