"""`hearth docs`: ask questions about files and folders, answered in a server session.

Two ways to give the model the documents, chosen by their size in tokens (POST /tokenize):

- **whole**: they fit the session's context. They go in once, as the session's first user message,
  prefilled with `max_tokens: 1`; every question after that reuses their KV and costs only its
  own tokens. A later run over unchanged documents finds them in the session (a fingerprint in
  that message) and skips the prefill.
- **retrieval**: they do not fit. Each file is split into chunks of whole lines; BM25 (`bm25s`)
  ranks the chunks against each question, the best ones that fit go into the question, and the
  answer is followed by the files and line ranges it was given.

The pure parts (collecting, chunking, ranking, prompts, citations) are `hearth.retrieval`; this
module holds the conversation with the server and the question loop.
"""

from __future__ import annotations

import hashlib
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
from hearth.retrieval.chunks import Chunk, chunk_document
from hearth.retrieval.documents import Document, collect
from hearth.retrieval.prompts import MARK, citations, documents_message, fingerprint, passage_block, question_message
from hearth.retrieval.ranking import Index, select_passages

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
        info: dict[str, Any] = self.client.get(f"/v1/sessions/{seg(self.session)}")
        return info

    def open(self) -> dict[str, Any]:
        try:
            created: dict[str, Any] = self.client.post("/v1/sessions", {"session_id": self.session})
            return created
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
    try:
        found, skipped = collect(paths)
    except FileNotFoundError as e:
        raise CLIError(str(e), 2) from e
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
