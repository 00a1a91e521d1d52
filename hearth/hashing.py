"""The SHA-256 of a file, read in blocks (model files are gigabytes): the one definition, used by
the model catalog (checking a download), the local backend (a model's KV identity) and snapshots
(checking their files)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The file's SHA-256 as lowercase hex."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
