"""The snapshot manifest's shape, checked strictly wherever one is read (import, get, list, load).

A manifest comes from disk or from an archive someone sent, so nothing in it is trusted: every
field has its type (no coercion: `"5"` is not an int), ids match their patterns, sizes are
non-negative, and the file list names exactly the snapshot's data files. A manifest that fails
is reported as corrupt (422) for that one snapshot; it never reaches code that would index into
it. Extra keys are refused too: a newer format announces itself with `format_version`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from hearth.ids import SNAPSHOT_ID, is_session_id
from hearth.text import scrub_value

DATA_FILES = ("transcript.json", "tokens.bin", "kv.bin")
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Scalar = str | int | float | bool | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ModelIdentity(_Strict):
    id: str = Field(max_length=1024)
    sha256: Sha256
    arch: str | None = Field(default=None, max_length=256)
    n_ctx_train: int | None = Field(default=None, ge=0)


class SessionFacts(_Strict):
    session_id: str
    n_tokens: int = Field(ge=0)
    max_seq_len: int | None = Field(default=None, ge=1)
    message_count: int | None = Field(default=None, ge=0)

    @field_validator("session_id")
    @classmethod
    def _session_id(cls, v: str) -> str:
        if not is_session_id(v):
            raise ValueError("not a session id")
        return v


class FileEntry(_Strict):
    bytes: int = Field(ge=0)
    sha256: Sha256


class Manifest(_Strict):
    id: str = Field(pattern=SNAPSHOT_ID.pattern)
    format_version: int
    created_at: int | float = Field(ge=0)
    model: ModelIdentity
    engine: dict[str, Scalar]
    session: SessionFacts
    title: str = Field(default="", max_length=200)
    description: str = Field(default="", max_length=4000)
    tags: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(default_factory=list,
                                                                                      max_length=32)
    files: dict[str, FileEntry]

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, FileEntry]) -> dict[str, FileEntry]:
        if set(v) != set(DATA_FILES):
            raise ValueError(f"files must list exactly {', '.join(DATA_FILES)}")
        return v


class ManifestInvalid(ValueError):
    pass


def check_manifest(raw: Any, *, repair_text: bool) -> dict[str, Any]:
    """The manifest as a plain dict once it has the right shape, else ManifestInvalid naming
    the first bad field. With `repair_text`, lone surrogates written by older servers are
    replaced (U+FFFD) first; an imported manifest is taken as it is."""
    if repair_text:
        raw = scrub_value(raw)
    try:
        Manifest.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ManifestInvalid(f"{loc}: {err['msg']}" if loc else err["msg"]) from e
    assert isinstance(raw, dict)
    return raw
