"""`hearth models` against what the server reports, and one-line errors with exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import run
from tests.helpers import Server, free_port


@pytest.mark.slow
def test_models_agree_with_the_loaded_model(cli_server: Server, tmp_path: Path) -> None:
    rows = json.loads(run("models", "--json", env={"HEARTH_MODELS": str(tmp_path)}).stdout)
    served = httpx.get(f"{cli_server.url}/v1/models", timeout=10).json()["data"][0]
    assert len(rows) == 1
    local = rows[0]
    assert local["default"] is True
    assert local["id"] == served["id"]
    assert local["path"] == served["meta"]["path"]
    # The file holds the tensors (the server's size_bytes) plus the header and vocabulary.
    assert local["size_bytes"] == Path(local["path"]).stat().st_size > served["meta"]["size_bytes"]
    assert local["context_length"] == served["meta"]["n_ctx_train"]
    assert local["architecture"] == served["meta"]["architecture"]
    # llama.cpp's own description ends with the quantization ("llama 256M Q4_1").
    assert served["meta"]["description"].split()[-1] == local["quantization"]


def test_models_table_lists_a_named_gguf_too(tmp_path) -> None:
    from hearth.models import embedded_model_path

    link = tmp_path / "copy-of-default.gguf"
    link.symlink_to(embedded_model_path())
    no_catalog = {"HEARTH_MODELS": str(tmp_path / "models")}
    result = run("models", "--model", f"mine={link}", env=no_catalog)
    assert result.exit_code == 0, result.output
    assert "smollm2-135m-instruct (default)" in result.stdout
    assert "mine" in result.stdout and "Q4_1" in result.stdout and "8192" in result.stdout
    # HEARTH_MODEL names models as --model does
    rows = json.loads(run("models", "--json", env={"HEARTH_MODEL": str(link), **no_catalog}).stdout)
    assert [r["id"] for r in rows] == ["smollm2-135m-instruct", "copy-of-default"]
    assert rows[1]["path"] == str(link.resolve()) and rows[1]["quantization"] == rows[0]["quantization"]


def test_installed_catalog_models_are_listed_by_short_name(tmp_path: Path) -> None:
    from hearth import catalog
    from hearth.models import embedded_model_path

    env = {"HEARTH_MODELS": str(tmp_path)}
    result = run("models", env=env)
    assert "not installed: qwen2.5-coder-0.5b" in result.stdout and "hearth models install" in result.stdout
    # a file in the model cache under the catalog's name is what `install` leaves there
    (tmp_path / catalog.QWEN_CODER.file).symlink_to(embedded_model_path())
    rows = json.loads(run("models", "--json", env=env).stdout)
    assert [r["id"] for r in rows] == ["smollm2-135m-instruct", "qwen2.5-coder-0.5b"]
    assert rows[1]["path"] == str(tmp_path / catalog.QWEN_CODER.file) and rows[1]["default"] is False
    assert "not installed: qwen2.5-coder-0.5b" not in run("models", env=env).stdout


@pytest.mark.parametrize("args, needle", [
    (["models", "install", "no-such-model"], "no model 'no-such-model' in the catalog"),
    (["models", "--model", "/nonexistent/x.gguf"], "model not found"),
    (["sessions", "ls", "--url", "http://127.0.0.1:{port}"], "no Hearth server answers"),
    (["snapshots", "export", "snap_" + "0" * 32, "--url", "http://127.0.0.1:{port}"], "no Hearth server answers"),
    (["sessions", "ls", "--url", "ftp://nowhere"], "not a server URL"),
    (["server", "stop", "--data-dir", "{tmp}"], "no background server is running"),
    (["server", "logs", "--data-dir", "{tmp}"], "no server log"),
    (["snapshots", "import", "{tmp}/missing.tar", "--url", "http://127.0.0.1:{port}"], "No such file"),
])
def test_errors_are_one_line_with_a_nonzero_exit(tmp_path, args: list[str], needle: str) -> None:
    port = free_port()
    result = run(*[a.format(port=port, tmp=tmp_path) for a in args])
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and needle in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_api_errors_carry_the_server_message(cli_server: Server) -> None:
    result = run("snapshots", "show", "not-a-snapshot-id", "--url", cli_server.url)
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert line.startswith("error: ") and "HTTP 4" in line and "\n" not in line


def test_every_verb_has_help_with_an_example() -> None:
    verbs = [["chat"], ["models"], ["models", "install"], ["server", "start"], ["server", "stop"], ["server", "status"],
             ["server", "logs"], *[["sessions", v] for v in ("ls", "show", "rm", "history")],
             *[["snapshots", v] for v in ("ls", "show", "rm", "load", "tag", "export", "import")]]
    for verb in verbs:
        result = run(*verb, "--help")
        assert result.exit_code == 0, verb
        assert "Example: hearth " + verb[0] in result.stdout, verb
