"""A small synchronous client for a running Hearth server, for the CLI verbs.

Every failure becomes a `CLIError` whose text is one line fit for stderr: the server's own
error message when it sent one, otherwise what went wrong on the wire.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# A stream may sit silent for a long prefill; reads wait long, connecting does not.
STREAM_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class CLIError(Exception):
    """A failure to report as one line on stderr with a non-zero exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class APIError(CLIError):
    """The server answered with an error status."""

    def __init__(self, status: int, message: str, error_code: str | None = None) -> None:
        super().__init__(f"{message} (HTTP {status}{', ' + error_code if error_code else ''})")
        self.status = status
        self.error_code = error_code


def resolve_url(url: str | None) -> str:
    return (url or os.environ.get("HEARTH_URL") or DEFAULT_URL).rstrip("/")


def error_from(response: httpx.Response) -> APIError:
    """The server's error envelope (OpenAI's or Anthropic's) as an APIError."""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        body = None
    message, code = None, None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message, code = body["error"].get("message"), body["error"].get("code")
    if not message:
        message = response.reason_phrase or "request failed"
    return APIError(response.status_code, " ".join(str(message).split()), code)


@dataclass(slots=True)
class StreamChunk:
    """One parsed `data:` event of a chat stream."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    id: str | None = None


def parse_chunk(data: dict[str, Any]) -> StreamChunk:
    if isinstance(data.get("error"), dict):
        return StreamChunk(error=str(data["error"].get("message") or "generation failed"))
    chunk = StreamChunk(usage=data.get("usage"), id=data.get("id"))
    for choice in data.get("choices") or []:
        delta = choice.get("delta") or {}
        chunk.content += delta.get("content") or ""
        chunk.reasoning += delta.get("reasoning_content") or ""
        chunk.finish_reason = choice.get("finish_reason") or chunk.finish_reason
    return chunk


class Client:
    """One server: `url` like http://127.0.0.1:8000, optional API key."""

    def __init__(self, url: str | None = None, api_key: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = resolve_url(url)
        parsed = urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise CLIError(f"not a server URL: {self.url!r} (expected e.g. {DEFAULT_URL})", 2)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # plumbing

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as e:
            raise CLIError(f"no Hearth server answers at {self.url} (start one with: hearth server start)") from e
        except httpx.TimeoutException as e:
            raise CLIError(f"{method} {path}: the server at {self.url} did not answer in time") from e
        except httpx.HTTPError as e:
            raise CLIError(f"{method} {path}: {e}") from e
        if response.status_code >= 400:
            raise error_from(response)
        return response

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs).json()

    def post(self, path: str, body: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json=body if body is not None else {}, **kwargs).json()

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PATCH", path, json=body).json()

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path).json()

    # health and metrics

    def health(self, timeout: float = 2.0) -> str:
        """`ok`, `loading`, `error: …`, or `down` when nothing answers. Never raises."""
        try:
            r = self._http.get("/health", timeout=timeout)
            body = r.json()
        except (httpx.HTTPError, ValueError):
            return "down"
        status = str(body.get("status", "down")) if isinstance(body, dict) else "down"
        if status == "error":
            return f"error: {body.get('error', 'the model failed to load')}"
        return status

    def metrics(self) -> dict[str, float]:
        """Prometheus samples summed over their labels: `hearth_kv_slots_busy` → value."""
        out: dict[str, float] = {}
        for name, _, value in self.samples():
            out[name] = out.get(name, 0.0) + value
        return out

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """Every Prometheus sample of /metrics: (name, labels, value)."""
        text = self.request("GET", "/metrics").text
        out: list[tuple[str, dict[str, str], float]] = []
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name, _, labels = name_labels.partition("{")
            try:
                out.append((name, dict(_LABEL.findall(labels)), float(value)))
            except ValueError:
                continue
        return out

    # chat

    def cancel(self, cancel_id: str) -> int:
        return int(self.post("/v1/cancel", {"cancel_id": cancel_id}, timeout=5.0).get("cancelled", 0))

    def stream_chat(self, body: dict[str, Any]) -> Iterator[StreamChunk]:
        """POST /v1/chat/completions with stream: true and yield its chunks until [DONE]."""
        body = {**body, "stream": True}
        try:
            with self._http.stream("POST", "/v1/chat/completions", json=body, timeout=STREAM_TIMEOUT) as r:
                if r.status_code >= 400:
                    r.read()
                    raise error_from(r)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield parse_chunk(json.loads(data))
        except httpx.ConnectError as e:
            raise CLIError(f"no Hearth server answers at {self.url}") from e
        except httpx.TimeoutException as e:
            raise CLIError("the server stopped sending the reply (timed out)") from e
        except httpx.HTTPError as e:
            raise CLIError(f"the reply stream broke: {e}") from e

    # files

    def download(self, path: str, dest: Path) -> int:
        """Stream GET `path` into `dest` (written to a temporary name, then renamed)."""
        tmp = dest.with_name(dest.name + ".part")
        written = 0
        try:
            with self._http.stream("GET", path, timeout=STREAM_TIMEOUT) as r:
                if r.status_code >= 400:
                    r.read()
                    raise error_from(r)
                with tmp.open("wb") as f:
                    for block in r.iter_bytes():
                        f.write(block)
                        written += len(block)
            tmp.replace(dest)
        except httpx.ConnectError as e:
            raise CLIError(f"no Hearth server answers at {self.url}") from e
        except httpx.HTTPError as e:
            raise CLIError(f"download failed: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)
        return written


def seg(value: str) -> str:
    """One URL path segment (ids are validated by the server; this keeps '/' out of paths)."""
    return quote(value, safe="")
