"""`hearth docs` against a real server (2048 tokens a sequence): whole documents in a session,
retrieval with citations when they do not fit, the question loop."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pexpect
import pytest

from hearth.cli.docs import PROMPT
from hearth.retrieval.documents import collect
from hearth.retrieval.prompts import documents_message
from tests.cli.conftest import metric
from tests.helpers import Server, wait_until

pytestmark = pytest.mark.slow

HEARTH = str(Path(sys.executable).parent / "hearth")
STATS = re.compile(r"prompt (\d+) tokens \(cached (\d+)\)")
SOURCE = re.compile(r"^\s+\[(\d+)\] (\S+):(\d+)(?:-(\d+))?", re.M)


@pytest.fixture
def live(cli_server: Server) -> Server:
    return cli_server


def small_folder(root: Path) -> Path:
    folder = root / "kb"
    (folder / "src").mkdir(parents=True)
    (folder / "kiln.md").write_text("# Kiln\n\nThe kiln of the pottery club is called Ember-7.\n"
                                    "It fires clay at 1200 degrees for nine hours.\n")
    (folder / "src" / "bake.py").write_text('def bake(loaf):\n    """Bake a loaf for 40 minutes."""\n    return loaf\n')
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    (folder / ".cache").mkdir()
    (folder / ".cache" / "notes.txt").write_text("hidden notes that must not be ingested\n")
    return folder


def docs(server: Server, *args: str, input: str | None = None) -> tuple[str, str]:
    from typer.testing import CliRunner

    from hearth.cli.main import app

    result = CliRunner().invoke(app, ["docs", *args, "--url", server.url, "--temperature", "0"], input=input,
                                env={"COLUMNS": "200"}, catch_exceptions=False)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.stdout, result.stderr


def stats(stderr: str) -> list[tuple[int, int]]:
    return [(int(p), int(c)) for p, c in STATS.findall(stderr)]


def test_documents_that_fit_go_in_once_and_are_reused(live: Server, tmp_path: Path) -> None:
    folder = small_folder(tmp_path)
    session = "docs-e2e-whole"
    out, err = docs(live, str(folder), "--session", session, "--max-tokens", "24", "--ask", "What is the kiln called?")
    assert "ingested 2 files" in err and "tokens prefilled" in err
    assert "skipped 1 binary files: kb/logo.png" in err
    assert out.strip(), "an answer was printed"
    assert "Sources:" not in out  # whole documents: nothing retrieved

    history = httpx.get(f"{live.url}/v1/sessions/{session}/history", timeout=10).json()["data"]
    found, _ = collect([folder])
    assert history[0] == {"role": "user", "content": documents_message(found)}
    assert "Ember-7" in history[0]["content"] and "Bake a loaf" in history[0]["content"]
    assert "hidden notes" not in history[0]["content"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[2]["content"] == "What is the kiln called?"
    docs_tokens = httpx.post(f"{live.url}/tokenize", timeout=10,
                             json={"messages": [history[0]]}).json()["count"]
    (prompt, cached), = stats(err)
    assert cached >= docs_tokens - 5, "the question reused the documents' KV"
    assert prompt - cached < 40, "only the question was prefilled"

    # A second run over the same files finds them in the session and only asks.
    out, err = docs(live, str(folder), "--session", session, "--max-tokens", "24", "--ask", "How long is a loaf baked?")
    assert "already in session docs-e2e-whole" in err and "ingested" not in err
    (prompt, cached), = stats(err)
    assert cached >= docs_tokens and prompt - cached < 40

    # Changed files are ingested again.
    (folder / "kiln.md").write_text("# Kiln\n\nThe kiln is now called Cinder-9.\n")
    out, err = docs(live, str(folder), "--session", session, "--max-tokens", "8", "--ask", "And now?")
    assert "documents changed" in err and "ingested 2 files" in err
    history = httpx.get(f"{live.url}/v1/sessions/{session}/history", timeout=10).json()["data"]
    assert "Cinder-9" in history[0]["content"] and len(history) == 4


def big_folder(root: Path) -> tuple[Path, Path, int]:
    """Far more than 2048 tokens; one line of one file holds the only mention of 'zirconium'."""
    folder = root / "manual"
    folder.mkdir()
    topics = ["kettles", "lanterns", "bellows", "chimneys", "hinges", "anvils", "candles", "ovens", "grates", "flues"]
    for i, topic in enumerate(topics):
        lines = [f"# On {topic}", ""]
        for j in range(40):
            lines.append(f"Section {j} about {topic}: keep the {topic} clean, check them weekly, note wear number {j}.")
            if j % 8 == 7:
                lines.append("")
        if topic == "anvils":
            lines.insert(23, "The best anvils have a face hardened with zirconium, says the smith.")
        (folder / f"{i:02d}-{topic}.md").write_text("\n".join(lines) + "\n")
    target = folder / "05-anvils.md"
    line = next(n for n, x in enumerate(target.read_text().splitlines(), 1) if "zirconium" in x)
    return folder, target, line


def test_documents_too_large_are_retrieved_and_cited(live: Server, tmp_path: Path) -> None:
    folder, target, line = big_folder(tmp_path)
    session = "docs-e2e-retrieval"
    out, err = docs(live, str(folder), "--session", session, "--max-tokens", "40",
                    "--ask", "What is the face of the best anvils hardened with?")
    assert "more than session docs-e2e-retrieval holds" in err and "BM25" in err
    assert "ingested" not in err
    assert "Sources:" in out
    sources = SOURCE.findall(out.rsplit("Sources:", 1)[1])
    assert sources, out
    cited = {(path, int(a), int(b or a)) for _, path, a, b in sources}
    assert any(path == f"manual/{target.name}" and a <= line <= b for path, a, b in cited), cited
    for path, a, b in cited:  # every citation names real lines of a real file
        text = (tmp_path / path).read_text().splitlines()
        assert 1 <= a <= b <= len(text)

    # The question went to the session with exactly those passages, numbered as printed.
    history = httpx.get(f"{live.url}/v1/sessions/{session}/history", timeout=10).json()["data"]
    asked = history[-2]["content"]
    for n, path, a, b in sources:
        assert f"[{n}] {path}:{a}{'-' + b if b else ''}\n" in asked
    assert "zirconium" in asked
    assert asked.rstrip().endswith("Question: What is the face of the best anvils hardened with?")
    (prompt, _), = stats(err)
    assert prompt <= 2048 - 40


def test_question_loop_answers_until_end_of_input(live: Server, tmp_path: Path) -> None:
    folder = small_folder(tmp_path)
    out, err = docs(live, str(folder), "--session", "docs-e2e-loop", "--retrieve", "--max-tokens", "16",
                    input="What is the kiln called?\n\nHow long is a loaf baked?\n/help\n/sources\n/nope\n"
                          "/quit\nNot asked: the loop has ended.\n")
    assert len(stats(err)) == 2, "two questions, two answers; /commands are not questions"
    assert out.count("Sources:") == 2
    assert "/sources" in out and "/quit" in out  # the help
    assert "2 documents in session docs-e2e-loop (retrieved per question):" in out and "kb/kiln.md (" in out
    assert "cited by the last answer:" in out and "unknown command /nope" in err
    assert re.search(r"\[1\] kb/kiln\.md:\d+", out)
    assert re.search(r"\[\d\] kb/src/bake\.py:\d+", out)
    history = httpx.get(f"{live.url}/v1/sessions/docs-e2e-loop/history", timeout=10).json()["data"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]


def test_ctrl_c_stops_an_answer_and_the_loop_goes_on(live: Server, tmp_path: Path) -> None:
    folder = small_folder(tmp_path)
    cancels = metric(live.url, "hearth_cancellations_total", cause="cancel_call")
    child = pexpect.spawn(HEARTH, ["docs", str(folder), "--url", live.url, "--session", "docs-e2e-ctrl-c",
                                   "--max-tokens", "1500", "--temperature", "0"],
                          encoding="utf-8", timeout=90, dimensions=(50, 200))
    child.logfile_read = sys.stdout  # shown by pytest on failure
    child.expect_exact("ingested 2 files")
    child.expect_exact(PROMPT)
    child.sendline("Write a very long story about the kiln, with ten chapters.")
    child.expect_exact("ten chapters.")
    child.expect(r"\w+\W+\w+\W+\w+\W+\w+\W+\w+")  # the answer is arriving
    child.sendintr()
    child.expect_exact("[stopped]")
    child.expect(r"completion (\d+)")
    assert 0 < int(child.match.group(1)) < 1500
    child.expect_exact(PROMPT)
    # counted when the run's stream closes, which may come just after the client's last chunk
    wait_until(lambda: metric(live.url, "hearth_cancellations_total", cause="cancel_call") == cancels + 1,
             "the cancel to be counted")
    wait_until(lambda: metric(live.url, "hearth_running_sequences") == 0, "the run to end on the server")

    child.sendline("What is the kiln called?")  # the loop is alive and the documents still in the session
    child.expect(r"prompt \d+ tokens \(cached (\d+)\)")
    assert int(child.match.group(1)) > 50
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
