"""What Ollama's clients read from both products besides the bodies: the NDJSON stream's
response type and the `/api/version` figures."""

from __future__ import annotations

from importlib import metadata as dist

from hearth.http.sse import EventStreamResponse

OLLAMA_API_VERSION = "0.12.0"  # the Ollama API version answered on /api/version
# Ollama's objects carry no id, so a node names a generation's answer (its usage-ledger row and
# journal record) in this header; a gateway reads it to find the row of a stream its client left.
ANSWER_ID_HEADER = "x-hearth-answer-id"


class NdjsonResponse(EventStreamResponse):
    """Ollama's stream: one JSON object a line. No heartbeat: NDJSON has no comment line, and
    Ollama's clients parse every line."""

    media_type = "application/x-ndjson"
    content_type = b"application/x-ndjson"


def hearth_version() -> str:
    try:
        return dist.version("hearth")
    except dist.PackageNotFoundError:
        return "unknown"
