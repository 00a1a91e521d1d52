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


def sampled_digest(path: Path, samples: int = 16, chunk: int = 1 << 16) -> str:
    """A quick identity of a large file: SHA-256 over its size and `samples` evenly spaced
    chunks (1 MiB read in all, milliseconds). Two fine-tunes of one base at one quantization
    have the same size and header shapes but different tensor bytes, so this tells them
    apart where a size or header check would not; it is not a check against tampering."""
    size = path.stat().st_size
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with path.open("rb") as f:
        for i in range(samples):
            f.seek(max(0, (size - chunk) * i // max(1, samples - 1)))
            h.update(f.read(chunk))
    return h.hexdigest()
