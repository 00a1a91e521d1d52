"""Model names as Ollama's clients write them (`name:tag`, the tag `latest` when none is given),
and Ollama's timestamps.

Hearth's ids carry no tag. A name resolves, in order, as given; without a `:latest` tag; and
with its tag joined by a hyphen (`qwen2.5-coder:0.5b` is the catalog's `qwen2.5-coder-0.5b`).
Models are listed as `<id>:latest`, as Ollama lists a model pulled without a tag."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hearth.backends.base import Backend
from hearth.errors import NotFound

LATEST = "latest"
# Ollama's expiry for a model kept forever (keep_alive < 0): now plus Go's longest duration.
FOREVER = timedelta(days=106_751)


def tagged(model_id: str) -> str:
    return model_id if ":" in model_id else f"{model_id}:{LATEST}"


def candidates(name: str) -> list[str]:
    """The names `name` may stand for among Hearth's, most literal first."""
    out = [name]
    base, sep, tag = name.rpartition(":")
    if sep and base and "/" not in tag:
        out.append(base if tag == LATEST else f"{base}-{tag}")
    return out


def not_found(name: str) -> NotFound:
    return NotFound(f'model "{name}" not found, try pulling it first', param="model", code="model_not_found")


def resolve(backend: Backend, name: str | None) -> str:
    """The id of the model `name` names; Ollama's 404 if none (a missing name: the default)."""
    if not name:
        return backend.resolve(None)
    for candidate in candidates(name):
        try:
            return backend.resolve(candidate)
        except NotFound:
            continue
    raise not_found(name)


def timestamp(at: datetime | None = None) -> str:
    """RFC 3339 in UTC with nanosecond digits, as Ollama writes `created_at`."""
    at = at or datetime.now(UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def from_epoch(seconds: float) -> str:
    return timestamp(datetime.fromtimestamp(seconds, UTC))
