"""The documents of a question: the text files under the files and folders given, in a stable
order, binary and hidden ones left out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = {"node_modules", "__pycache__", "venv", "site-packages", "dist", "build", "target"}
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".ico", ".pdf", ".zip", ".gz", ".tgz", ".xz",
                   ".bz2", ".tar", ".7z", ".so", ".dylib", ".dll", ".exe", ".bin", ".o", ".a", ".pyc", ".class",
                   ".jar", ".gguf", ".safetensors", ".pt", ".npy", ".npz", ".sqlite", ".db", ".woff", ".woff2",
                   ".ttf", ".mp3", ".mp4", ".wav", ".mov"}
MAX_FILE_BYTES = 2_000_000


@dataclass(frozen=True, slots=True)
class Document:
    path: str  # as shown and cited: relative to the folder given, or as given for a file
    text: str


def read_text(path: Path) -> str | None:
    """The file as text, or None for a binary, undecodable or oversized file."""
    if path.suffix.lower() in BINARY_SUFFIXES or path.stat().st_size > MAX_FILE_BYTES:
        return None
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def collect(paths: list[Path]) -> tuple[list[Document], list[str]]:
    """Text files under `paths` (folders walked in name order, hidden entries skipped) and the
    names of the files skipped as binary. FileNotFoundError for a path that does not exist."""
    docs: list[Document] = []
    skipped: list[str] = []
    seen: set[Path] = set()
    for root in paths:
        if not root.exists():
            raise FileNotFoundError(f"no such file or folder: {root}")
        if root.is_file():
            files = [(root, str(root))]
        else:
            files = [(f, f.relative_to(root).as_posix()) for f in sorted(root.rglob("*"))
                     if f.is_file() and not any(p.startswith(".") or p in SKIP_DIRS
                                                for p in f.relative_to(root).parts)]
            if root.name and root.name not in (".", ".."):
                files = [(f, f"{root.name}/{shown}") for f, shown in files]
        for f, shown in files:
            if f.resolve() in seen:
                continue
            seen.add(f.resolve())
            text = read_text(f)
            if text is None:
                skipped.append(shown)
            elif text.strip():
                docs.append(Document(shown, text))
    return docs, skipped
