"""`hearth docs` without a server: collecting files, chunking, BM25 ranking, prompts, citations
(hearth.retrieval), and the command's own checks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hearth.cli.docs import default_session
from hearth.retrieval.chunks import Chunk, chunk_document
from hearth.retrieval.documents import Document, collect, read_text
from hearth.retrieval.prompts import MARK, citations, documents_message, fingerprint, question_message
from hearth.retrieval.ranking import Index, select_passages, terms
from tests.cli.conftest import run


def make_tree(root: Path) -> Path:
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "kiln.md").write_text("# Kiln\n\nThe kiln fires at 1200 degrees.\n")
    (root / "notes" / "bake.py").write_text("def bake(loaf):\n    return loaf\n")
    (root / "notes" / "bom.txt").write_bytes("\ufeffwith a byte order mark\n".encode())
    (root / "notes" / "empty.txt").write_text("  \n")
    (root / "notes" / "data.bin").write_bytes(bytes(range(256)) * 4)
    (root / "notes" / "photo.png").write_bytes(b"\x89PNG not really")
    (root / "notes" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "notes" / ".git").mkdir()
    (root / "notes" / ".git" / "config").write_text("hidden\n")
    (root / "notes" / "node_modules" / "pkg").mkdir(parents=True)
    (root / "notes" / "node_modules" / "pkg" / "index.js").write_text("vendored\n")
    (root / "notes" / ".env").write_text("SECRET=1\n")
    return root / "notes"


def test_collect_reads_text_and_skips_binaries_and_hidden(tmp_path: Path) -> None:
    folder = make_tree(tmp_path)
    docs, skipped = collect([folder])
    assert [d.path for d in docs] == ["notes/bake.py", "notes/bom.txt", "notes/kiln.md"]
    assert next(d for d in docs if d.path == "notes/bom.txt").text == "with a byte order mark\n"
    assert sorted(skipped) == ["notes/data.bin", "notes/latin1.txt", "notes/photo.png"]
    # A file given by name is taken as given, once, even when its folder is given too.
    docs, _ = collect([folder / "kiln.md", folder])
    assert [d.path for d in docs].count(str(folder / "kiln.md")) == 1
    assert "notes/kiln.md" not in [d.path for d in docs]


def test_read_text_refuses_binary(tmp_path: Path) -> None:
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"text\0more")
    assert read_text(nul) is None
    ok = tmp_path / "ok.rs"
    ok.write_text("fn main() {}\n")
    assert read_text(ok) == "fn main() {}\n"


def test_collect_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        collect([tmp_path / "missing"])
    only_binary = tmp_path / "bin"
    only_binary.mkdir()
    (only_binary / "x.bin").write_bytes(b"\0\1\2")
    result = run("docs", str(only_binary), "--url", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert "no text files" in result.stderr
    result = run("docs", str(tmp_path / "missing"), "--url", "http://127.0.0.1:9")
    assert result.exit_code == 2 and "no such file or folder" in result.stderr


def lines_of(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["ember", "hearth", "kiln", "loaf", "session", "token", "cache", "slot", "snapshot"]
    out = []
    for i in range(n):
        if rng.random() < 0.15:
            out.append("")
        else:
            out.append(f"{i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 14))))
    return out


@pytest.mark.parametrize("max_chars", [40, 120, 400])
def test_chunks_are_whole_lines_in_order_and_bounded(max_chars: int) -> None:
    lines = lines_of(300, seed=max_chars)
    doc = Document("a.md", "\n".join(lines) + "\n")
    chunks = chunk_document(doc, max_chars=max_chars)
    assert chunks
    prev_end = 0
    pieces: dict[int, str] = {}
    for c in chunks:
        assert c.path == "a.md" and c.end >= c.start
        long_line = c.start == c.end and len(lines[c.start - 1]) > max_chars
        assert c.start > prev_end or (long_line and c.start == prev_end)
        if long_line:  # cut into pieces that all cite the line
            pieces[c.start] = pieces.get(c.start, "") + c.text
        else:
            assert c.text == "\n".join(lines[c.start - 1:c.end])  # exactly the lines it cites
        assert len(c.text) <= max_chars
        assert c.text.strip()
        assert all(not x.strip() for x in lines[prev_end:c.start - 1]), "only blank lines fall between chunks"
        prev_end = c.end
    assert all(pieces[n] == lines[n - 1] for n in pieces)
    assert all(not x.strip() for x in lines[prev_end:])


def test_chunks_prefer_blank_lines_and_cut_long_lines() -> None:
    text = "one\ntwo\nthree\n\nfour\nfive\n" + "x" * 50 + "\nsix\n"
    chunks = chunk_document(Document("f.txt", text), max_chars=20)
    assert [(c.start, c.end) for c in chunks[:2]] == [(1, 3), (5, 6)]  # cut at the blank line
    long = [c for c in chunks if c.text.startswith("x")]
    assert [(c.start, c.end, len(c.text)) for c in long] == [(7, 7, 20), (7, 7, 20), (7, 7, 10)]
    assert chunks[-1].text == "six" and chunks[-1].cite == "f.txt:8"
    assert chunks[0].cite == "f.txt:1-3"


def test_terms_split_identifiers_and_drop_stop_words() -> None:
    assert terms("How does parseConfigFile work?") == ["parseconfigfile", "parse", "config", "file", "work"]
    assert terms("the max_seq_len of HTTPServer") == ["max", "seq", "len", "httpserver", "http", "server"]
    assert terms("a b c 42") == ["42"]


def test_bm25_ranks_the_chunk_with_the_rare_term_first() -> None:
    docs = [Document(f"f{i}.md", "\n".join(lines_of(60, seed=i))) for i in range(5)]
    special = Document("guide/zirconium.md", "\n".join(
        [*lines_of(20, seed=9), "The crucible is made of zirconium oxide.", *lines_of(20, seed=10)]))
    chunks = [c for d in [*docs, special] for c in chunk_document(d, max_chars=300)]
    index = Index(chunks)
    hits = index.search("What is the crucible made of?", k=3)
    assert hits and hits[0][0].path == "guide/zirconium.md"
    assert "crucible" in hits[0][0].text
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert len(hits) <= 3
    # A file's name counts too; words the index never saw match nothing.
    assert index.search("zirconium", k=1)[0][0].path == "guide/zirconium.md"
    assert index.search("quetzalcoatl xylophone", k=3) == []


def test_select_passages_respects_the_budget_in_rank_order() -> None:
    a, b, c, d = (Chunk("x", i, i, str(i)) for i in range(1, 5))
    tokens = {a: 50, b: 200, c: 40, d: 30}
    assert select_passages([a, b, c, d], tokens, budget=130) == [a, c, d]
    assert select_passages([b, a], tokens, budget=260) == [b, a]
    assert select_passages([b], tokens, budget=100) == []


def test_documents_message_and_fingerprint() -> None:
    docs = [Document("a.md", "alpha\n"), Document("b/c.py", "print('c')\n")]
    message = documents_message(docs)
    assert message.startswith(f"{MARK} {fingerprint(docs)}: 2 files]")
    assert "=== a.md ===\nalpha\n=== end of a.md ===" in message and "print('c')" in message
    changed = [docs[0], Document("b/c.py", "print('d')\n")]
    assert fingerprint(changed) != fingerprint(docs)
    assert fingerprint(list(docs)) == fingerprint(docs)


def test_question_message_numbers_passages_and_citations_follow() -> None:
    p1, p2 = Chunk("docs/api.md", 421, 440, "POST /v1/cancel stops runs."), Chunk("README.md", 3, 3, "Hearth.")
    message = question_message("How do I cancel?", [p1, p2])
    assert "[1] docs/api.md:421-440\nPOST /v1/cancel stops runs." in message
    assert "[2] README.md:3\nHearth." in message
    assert message.rstrip().endswith("Question: How do I cancel?")
    assert citations([p1, p2], "Use the cancel endpoint [2].") == [
        "[1] docs/api.md:421-440", "[2] README.md:3  (cited)"]
    assert "No passage" in question_message("Anything?", [])


def test_default_session_depends_on_the_paths_not_their_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert default_session([a, b]) == default_session([b, a])
    assert default_session([a]) != default_session([b])
    assert default_session([a]).startswith("docs-")
