"""`hearth docs`: ask questions about files and folders, answered in a server session.

Two ways to give the model the documents, chosen by their size in tokens (POST /tokenize):

- **whole**: they fit the session's context. They go in once, as the session's first user message,
  prefilled with `max_tokens: 1`; every question after that reuses their KV and costs only its
  own tokens. A later run over unchanged documents finds them in the session (a fingerprint in
  that message) and skips the prefill.
- **retrieval**: they do not fit. Each file is split into chunks of whole lines; BM25 (`bm25s`)
  ranks the chunks against each question, the best ones that fit go into the question, and the
  answer is followed by the files and line ranges it was given.

The pure parts (collecting, chunking, ranking, prompts, citations) are at the top and unit-tested;
the server conversation is below.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from hearth.cli.client import APIError, Client, CLIError, seg
from hearth.cli.common import cli_errors, interactive_sigint

# ---------------------------------------------------------------------------- collecting files

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
    names of the files skipped as binary."""
    docs: list[Document] = []
    skipped: list[str] = []
    seen: set[Path] = set()
    for root in paths:
        if not root.exists():
            raise CLIError(f"no such file or folder: {root}", 2)
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


# ---------------------------------------------------------------------------- chunks and ranking


@dataclass(frozen=True, slots=True)
class Chunk:
    path: str
    start: int  # first line, 1-based
    end: int  # last line, inclusive
    text: str

    @property
    def cite(self) -> str:
        return f"{self.path}:{self.start}" if self.start == self.end else f"{self.path}:{self.start}-{self.end}"


def chunk_document(doc: Document, max_chars: int) -> list[Chunk]:
    """Whole lines, at most `max_chars` a chunk, without blank lines at either end. A chunk is cut
    after the last blank line in its second half when there is one; a line longer than
    `max_chars` is cut into pieces that all cite that line."""
    chunks: list[Chunk] = []
    buf: list[tuple[int, str]] = []  # (line number, line) not yet in a chunk
    size = 0  # len("\n".join(buf)) + 1

    def emit(part: list[tuple[int, str]]) -> None:
        while part and not part[0][1].strip():
            part = part[1:]
        while part and not part[-1][1].strip():
            part = part[:-1]
        if part:
            chunks.append(Chunk(doc.path, part[0][0], part[-1][0], "\n".join(line for _, line in part)))

    for no, line in enumerate(doc.text.splitlines(), 1):
        if len(line) > max_chars:
            emit(buf)
            buf, size = [], 0
            chunks += [Chunk(doc.path, no, no, line[i:i + max_chars]) for i in range(0, len(line), max_chars)
                       if line[i:i + max_chars].strip()]
            continue
        while buf and size + len(line) > max_chars:
            blanks = [i for i in range(len(buf) // 2, len(buf)) if not buf[i][1].strip()]
            cut = blanks[-1] + 1 if blanks else len(buf)
            emit(buf[:cut])
            buf = buf[cut:]
            size = sum(len(x) + 1 for _, x in buf)
        buf.append((no, line))
        size += len(line) + 1
    emit(buf)
    return chunks


_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_STOP = ("a an and are as at be but by can do does for from has have how i if in into is it its me my not of on or "
         "our so than that the their them then there these they this to was we were what when where which who why "
         "will with you your")
STOP_WORDS = frozenset(_STOP.split())


def terms(text: str) -> list[str]:
    """BM25 terms: lower-cased words without stop words; identifiers also by their parts
    (`parseConfigFile`, `parse_config_file` → parse, config, file)."""
    out = []
    for word in _WORD.findall(text):
        whole = word.lower()
        parts = [p.lower() for p in _CAMEL.findall(word)]
        for t in [whole, *parts] if len(parts) > 1 else [whole]:
            if len(t) > 1 and t not in STOP_WORDS:
                out.append(t)
    return out


class Index:
    """BM25 over chunks; a chunk is indexed with its file's path, so file names count."""

    def __init__(self, chunks: list[Chunk]) -> None:
        import bm25s  # imported here: `hearth --help` should not pay for it

        self.chunks = chunks
        self._bm25 = bm25s.BM25()
        self._bm25.index([terms(c.path.replace("/", " ") + "\n" + c.text) or ["\x00"] for c in chunks],
                         show_progress=False)

    def search(self, question: str, k: int) -> list[tuple[Chunk, float]]:
        """The best `k` chunks with a score above zero, best first."""
        vocab = self._bm25.vocab_dict
        query = [t for t in terms(question) if t in vocab]
        if not query or not self.chunks:
            return []
        scores = self._bm25.get_scores(query)
        order = sorted(range(len(self.chunks)), key=lambda i: (-float(scores[i]), i))
        return [(self.chunks[i], float(scores[i])) for i in order[:k] if scores[i] > 0]


def select_passages(ranked: list[Chunk], tokens: dict[Chunk, int], budget: int) -> list[Chunk]:
    """The ranked chunks, best first, that fit in `budget` tokens together (a chunk that does not
    fit is passed over for smaller ones after it)."""
    chosen, used = [], 0
    for c in ranked:
        if used + tokens[c] <= budget:
            chosen.append(c)
            used += tokens[c]
    return chosen


# ---------------------------------------------------------------------------- prompts and citations

MARK = "[hearth docs"  # how a session's first message says it holds documents


def fingerprint(docs: list[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(d.path.encode() + b"\0" + d.text.encode() + b"\0")
    return h.hexdigest()[:16]


def documents_message(docs: list[Document]) -> str:
    files = "\n\n".join(f"=== {d.path} ===\n{d.text.rstrip()}\n=== end of {d.path} ===" for d in docs)
    return (f"{MARK} {fingerprint(docs)}: {len(docs)} files]\n"
            f"Here are my documents. Answer my questions about them from what they say, and name the "
            f"files you used.\n\n{files}\n\nReply with OK once you have read them.")


def passage_block(n: int, c: Chunk) -> str:
    return f"[{n}] {c.cite}\n{c.text.rstrip()}"


def question_message(question: str, passages: list[Chunk]) -> str:
    if not passages:
        return f"{MARK} passages]\nNo passage of my documents matches this question.\n\nQuestion: {question}"
    blocks = "\n\n".join(passage_block(i, c) for i, c in enumerate(passages, 1))
    return (f"{MARK} passages]\nPassages from my documents:\n\n{blocks}\n\n"
            f"Answer from these passages and cite them by number, like [1].\n\nQuestion: {question}")


def citations(passages: list[Chunk], answer: str) -> list[str]:
    """One line per passage given: `[n] file:start-end`, marked when the answer cites it."""
    cited = {int(n) for n in re.findall(r"\[(\d+)\]", answer)}
    return [f"[{i}] {c.cite}{'  (cited)' if i in cited else ''}" for i, c in enumerate(passages, 1)]


# ---------------------------------------------------------------------------- the server side

ANSWER_ROOM = 256  # tokens kept free past the documents for a question and its template
PROMPT = "docs> "
HELP = """commands (anything else is a question about the documents):
  /help      this help
  /sources   the documents in the session, and the passages the last answer cited
  /quit      leave (also /exit, Ctrl-D)"""


@dataclass
class DocsSession:
    client: Client
    out: Console  # answers (stdout)
    err: Console  # progress and notices (stderr)
    api_key: str | None
    session: str
    max_tokens: int
    temperature: float
    top_k: int
    whole: bool = True
    base: int = 0  # messages kept when the session is rolled back to make room
    index: Index | None = None
    tokens: dict[Chunk, int] | None = None
    docs: list[Document] = field(default_factory=list)
    last_sources: list[str] = field(default_factory=list)  # what the last answer cited

    def command(self, line: str) -> bool:
        """A /command of the question loop; True when it asks to leave."""
        name = line.split(maxsplit=1)[0].lower()
        if name in ("/quit", "/exit", "/q"):
            return True
        if name == "/help":
            self.out.print(HELP, markup=False, highlight=False)
        elif name == "/sources":
            how = "whole" if self.whole else "retrieved per question"
            self.out.print(f"{len(self.docs)} documents in session {self.session} ({how}):", markup=False)
            for d in self.docs:
                self.out.print(f"  {d.path} ({len(d.text.splitlines())} lines)", markup=False, highlight=False)
            if self.last_sources:
                self.out.print("cited by the last answer:", markup=False)
                for line in self.last_sources:
                    self.out.print(f"  {line}", markup=False, highlight=False)
        else:
            self.err.print(f"unknown command {name}; /help lists them", markup=False)
        return False

    def info(self) -> dict[str, Any]:
        return self.client.get(f"/v1/sessions/{seg(self.session)}")

    def open(self) -> dict[str, Any]:
        try:
            return self.client.post("/v1/sessions", {"session_id": self.session})
        except APIError as e:
            if e.status == 404:
                raise CLIError(f"the server at {self.client.url} has no sessions API, which hearth docs needs") from e
            if e.error_code != "session_exists":
                raise
        return self.info()

    def count(self, messages: list[dict[str, str]]) -> int:
        return int(self.client.post("/tokenize", {"messages": messages})["count"])

    def prepare(self, docs: list[Document], chunk_tokens: int, retrieve: bool) -> None:
        self.docs = docs
        s = self.open()
        history = self.client.get(f"/v1/sessions/{seg(self.session)}/history")["data"]
        first = str(history[0].get("content") or "") if history else ""
        if history and not first.startswith(MARK):
            raise CLIError(f"session {self.session} holds another conversation; pick another --session", 2)
        message = documents_message(docs)
        limit = int(s["max_seq_len"])
        fits = not retrieve and len(message) < limit * 8 and (
            self.count([{"role": "user", "content": message}]) + self.max_tokens + ANSWER_ROOM <= limit)
        if fits:
            self.whole, self.base = True, 2
            if first.startswith(f"{MARK} {fingerprint(docs)}:"):
                self.err.print(f"the {len(docs)} files are already in session {self.session} "
                               f"({s['current_pos']} tokens in its KV cache)", markup=False)
                return
            if history:
                self.err.print(f"the documents changed: ingesting them again into session {self.session}",
                               markup=False)
                self.rollback(0)
            self.prefill(message, len(docs))
            return
        self.whole, self.base = False, 0
        if history and not first.startswith(f"{MARK} passages]"):
            self.rollback(0)  # the documents in it are whole and stale: questions bring passages now
        self.build_index(docs, chunk_tokens, limit)

    def prefill(self, message: str, n_files: int) -> None:
        """The documents as the first user message, generating one token; the bar follows the
        server's prefilled-token counter while the request runs."""
        messages = [{"role": "user", "content": message}]
        total = self.count(messages)
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["r"] = self.client.post("/v1/chat/completions", {
                    "messages": messages, "session_id": self.session, "max_tokens": 1, "temperature": 0},
                    timeout=600.0)
            except CLIError as e:
                result["e"] = e

        before = self.prefilled()
        worker = threading.Thread(target=run, daemon=True)
        with Progress(TextColumn("ingesting {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("tokens prefilled"), TimeElapsedColumn(), console=self.err) as bar:
            task = bar.add_task(f"{n_files} files", total=total)
            worker.start()
            while worker.is_alive():
                worker.join(0.2)
                now = self.prefilled()
                if before is not None and now is not None:
                    bar.update(task, completed=min(max(now - before, 0), total))
            if "e" in result:
                raise result["e"]
            usage = result["r"]["usage"]
            bar.update(task, completed=total)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        self.err.print(f"ingested {n_files} files into session {self.session}: {usage['prompt_tokens']} tokens "
                       f"({usage['prompt_tokens'] - cached} prefilled, {cached} cached)", markup=False)

    def prefilled(self) -> float | None:
        try:
            return self.client.metrics().get("hearth_prompt_tokens_total")
        except CLIError:
            return None

    def build_index(self, docs: list[Document], chunk_tokens: int, limit: int) -> None:
        chunks = [c for d in docs for c in chunk_document(d, max_chars=chunk_tokens * 3)]
        self.tokens = {}
        with Progress(TextColumn("indexing"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"),
                      console=self.err, transient=True) as bar:
            task = bar.add_task("", total=len(chunks))
            for i, c in enumerate(chunks, 1):
                text = passage_block(i, c)
                self.tokens[c] = int(self.client.post("/tokenize", {"content": text})["count"]) + 2
                bar.update(task, completed=i)
        self.index = Index(chunks)
        self.err.print(f"{len(docs)} files are more than session {self.session} holds ({limit} tokens): "
                       f"each question gets the best of {len(chunks)} chunks (BM25)", markup=False)

    def rollback(self, keep: int) -> None:
        self.client.post(f"/v1/sessions/{seg(self.session)}/rollback", {"keep_messages": keep})

    def ask(self, question: str) -> None:
        from hearth.cli.turn import run_turn

        passages: list[Chunk] = []
        s = self.info()
        limit = int(s["max_seq_len"])
        need = self.count([{"role": "user", "content": question}]) + self.max_tokens + 64
        if not self.whole:
            assert self.index is not None and self.tokens is not None
            free = limit - need - 64
            if free - int(s["current_pos"]) < free // 2:  # the conversation so far leaves too little room
                self.rollback(self.base)
                s = self.info()
            ranked = [c for c, _ in self.index.search(question, self.top_k)]
            passages = select_passages(ranked, self.tokens, max(free - int(s["current_pos"]), 0))
            content = question_message(question, passages)
        else:
            if int(s["current_pos"]) + need > limit:
                self.rollback(self.base)
            content = question
        body = {"messages": [{"role": "user", "content": content}], "session_id": self.session,
                "max_tokens": self.max_tokens, "temperature": self.temperature}
        try:
            result = run_turn(self.client, body, self.out, self.api_key)
        except APIError as e:
            if e.error_code != "context_length_exceeded":
                raise
            self.rollback(self.base)
            result = run_turn(self.client, body, self.out, self.api_key)
        st = result.stats
        self.err.print(Text(f"prompt {st.prompt_tokens} tokens (cached {st.cached_tokens}) · completion "
                            f"{st.completion_tokens} · {st.seconds:.1f} s", style="dim"))
        self.last_sources = citations(passages, result.content) if passages else []
        if passages:
            self.out.print("Sources:", style="bold")
            for line in self.last_sources:
                self.out.print(f"  {line}", markup=False, highlight=False)
        elif not self.whole:
            self.out.print("Sources: none (no passage matched the question)", markup=False)


def default_session(paths: list[Path]) -> str:
    key = "\0".join(sorted(str(p.resolve()) for p in paths))
    return "docs-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@cli_errors
def docs(
    paths: Annotated[list[Path], typer.Argument(help="Files and folders (text, markdown, code).",
                                                show_default=False)],
    session: Annotated[str | None, typer.Option(
        "--session", "-s", help="Session to hold the documents (default: one named after the paths).")] = None,
    ask: Annotated[str | None, typer.Option(
        "--ask", "-q", help="Answer this one question and exit, instead of the question loop.")] = None,
    url: Annotated[str | None, typer.Option(
        "--url", help="Server URL (env HEARTH_URL, default http://127.0.0.1:8000, where a server is started "
        "if none answers).", show_default=False)] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="HEARTH_API_KEY", help="API key, if the server needs one.", show_default=False)] = None,
    max_tokens: Annotated[int, typer.Option(help="Most tokens per answer.")] = 400,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.2,
    top_k: Annotated[int, typer.Option(help="Passages per question, when retrieving.")] = 4,
    chunk_tokens: Annotated[int, typer.Option(help="About this many tokens per chunk, when retrieving.")] = 200,
    retrieve: Annotated[bool, typer.Option(
        "--retrieve", help="Retrieve passages per question even when the documents would fit whole.")] = False,
) -> None:
    """Ask questions about files and folders; the answers come from a server session.

    Documents that fit the session's context go in whole, once, so each question costs only its
    own tokens; larger ones are split into chunks and the best passages for each question
    (BM25) go with it, cited by file and line range. Hidden folders and binary files are skipped.

    Example: hearth docs README.md docs/ --ask "How do I cancel a run?"
    """
    from hearth.cli.chat import connect

    if max_tokens < 1 or top_k < 1 or chunk_tokens < 16:
        raise CLIError("--max-tokens and --top-k must be at least 1, --chunk-tokens at least 16", 2)
    found, skipped = collect(paths)
    err = Console(stderr=True, highlight=False)
    if skipped:
        err.print(f"skipped {len(skipped)} binary files: {', '.join(skipped[:5])}"
                  f"{' …' if len(skipped) > 5 else ''}", markup=False)
    if not found:
        raise CLIError("no text files found in the given paths", 2)
    out = Console(highlight=False, soft_wrap=True)
    with connect(url, api_key) as client:
        ds = DocsSession(client, out, err, api_key, session or default_session(paths), max_tokens, temperature,
                         top_k)
        ds.prepare(found, chunk_tokens, retrieve)
        if ask is not None:
            ds.ask(ask)
            return
        err.print("ask about the documents; /help lists commands, Ctrl-C stops an answer, Ctrl-D leaves",
                  style="dim")
        interactive_sigint()
        while True:
            try:
                question = input(PROMPT).strip()
            except EOFError:
                return
            except KeyboardInterrupt:
                out.print()
                continue
            if question.startswith("/"):
                if ds.command(question):
                    return
            elif question:
                try:
                    ds.ask(question)
                except CLIError as e:
                    err.print(Text(f"error: {e}", style="red"))
