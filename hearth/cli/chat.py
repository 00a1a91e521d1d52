"""`hearth chat`: a REPL against a running server; the conversation lives in a server session.

Against a server without sessions (GET /v1/sessions is 404) the REPL keeps the transcript
itself and sends it whole each turn, so it still works, but nothing survives the REPL.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlparse

import typer
from rich.console import Console
from rich.text import Text

from hearth.cli.client import APIError, Client, CLIError, resolve_url, seg
from hearth.cli.common import cli_errors, interactive_sigint
from hearth.cli.daemon import Daemon, ServeOptions
from hearth.cli.server import start_server
from hearth.cli.sessions import print_history, sessions_table
from hearth.cli.snapshots import snapshots_table
from hearth.cli.turn import TurnStats, run_turn
from hearth.config import is_loopback
from hearth.ids import is_session_id

PROMPT, CONTINUE = "you> ", "...  "

HELP = """\
Type a message and press Enter. End a line with a backslash (\\) to continue on the next line.
Ctrl-C stops the reply being written (the REPL stays); Ctrl-D leaves.

  /save [title]   save the session as a snapshot
  /load ID        load a snapshot into a new session and continue there
  /retry          regenerate the last answer (the session is rolled back one turn)
  /edit N [TEXT]  replace message N (a user message, numbered as in /history) and regenerate
                  from there; without TEXT, edit the old text on the prompt line
  /branch N [TEXT]  as /edit, in a new session that starts from a snapshot of messages 1..N-1
                  (their KV is reused, nothing is prefilled again); the current session is kept
  /rollback N     keep only the first N messages of the session (numbers as in /history)
  /history        the session's messages, numbered
  /system TEXT    set the system message (applies from the next turn; /system alone shows it)
  /clear          start a new, empty session
  /sessions       the server's sessions
  /snapshots      the server's snapshots
  /stats          tokens, cached tokens, time to first token and tok/s of the last turn
  /help           this help"""


def new_session_name() -> str:
    return f"chat-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass
class Repl:
    client: Client
    out: Console
    api_key: str | None
    session: str
    system: str | None = None
    replace_system: bool = False  # the system message changed: tell the server to take the new one
    max_tokens: int | None = None
    temperature: float | None = None
    model: str | None = None
    server_sessions: bool = True
    local: list[dict[str, Any]] = field(default_factory=list)  # the transcript, without server sessions
    last: TurnStats | None = None
    markdown: bool = True  # render answers as markdown (--plain: raw text)
    err: Console = field(default_factory=lambda: Console(stderr=True, highlight=False, soft_wrap=True))

    # turns

    def say(self, text: str) -> None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
        if not self.server_sessions:
            messages += self.local
        messages.append({"role": "user", "content": text})
        body: dict[str, Any] = {"messages": messages}
        for key, value in (("model", self.model), ("max_tokens", self.max_tokens),
                           ("temperature", self.temperature)):
            if value is not None:
                body[key] = value
        if self.server_sessions:
            body["session_id"] = self.session
            if self.replace_system:
                body["replace_system"] = True
        result = run_turn(self.client, body, self.out, self.api_key, markdown=self.markdown)
        self.last = result.stats
        self.replace_system = False
        if not self.server_sessions:
            self.local += [{"role": "user", "content": text}, {"role": "assistant", "content": result.content}]

    # slash commands

    def command(self, line: str) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        handler = self.commands().get(name)
        if handler is None:
            self.out.print(f"unknown command {name}; /help lists them")
            return
        handler(arg)

    def commands(self) -> dict[str, Callable[[str], None]]:
        return {"/help": lambda _: self.out.print(HELP, markup=False), "/save": self.save, "/load": self.load,
                "/rollback": self.rollback, "/retry": self.retry, "/edit": self.edit, "/branch": self.branch,
                "/history": self.history, "/system": self.set_system,
                "/clear": self.clear, "/sessions": self.sessions, "/snapshots": self.snapshots,
                "/stats": self.stats}

    def _needs_sessions(self) -> None:
        if not self.server_sessions:
            raise CLIError("this server has no sessions (GET /v1/sessions is 404)")

    def save(self, title: str) -> None:
        self._needs_sessions()
        with self.out.status("saving the session…"):
            snap = self.client.post(f"/v1/sessions/{seg(self.session)}/save", {"title": title} if title else {})
        self.out.print(f"saved snapshot {snap.get('snapshot_id')}" + (f" ({title})" if title else ""))

    def load(self, snapshot_id: str) -> None:
        self._needs_sessions()
        if not snapshot_id:
            raise CLIError("usage: /load SNAPSHOT_ID (see /snapshots)")
        name = new_session_name()
        with self.out.status(f"loading {snapshot_id}…"):
            s = self.client.post(f"/v1/snapshots/{seg(snapshot_id)}/load", {"session_id": name})
        self.session = str(s.get("session_id", name))
        self.out.print(f"loaded {snapshot_id} into session {self.session} ({s.get('message_count', '?')} messages, "
                       f"{s.get('current_pos', '?')} tokens); /history shows it")

    def rollback(self, arg: str) -> None:
        if not arg.isdigit():
            raise CLIError("usage: /rollback N (keep the first N messages; see /history)")
        keep = int(arg)
        if not self.server_sessions:
            self.local = self.local[:keep]
            self.out.print(f"kept the first {len(self.local)} messages")
            return
        s = self.client.post(f"/v1/sessions/{seg(self.session)}/rollback", {"keep_messages": keep})
        self.out.print(f"session {self.session} now has {s.get('message_count', '?')} messages "
                       f"({s.get('current_pos', '?')} tokens)")

    def messages(self) -> list[dict[str, Any]]:
        if not self.server_sessions:
            return list(self.local)
        try:
            return list(self.client.get(f"/v1/sessions/{seg(self.session)}/history")["data"])
        except APIError as e:
            if e.status != 404 or e.error_code != "session_not_found":
                raise
            return []

    def _cut(self, keep: int) -> None:
        """Keep the first `keep` messages (rollback cuts the session's KV to match)."""
        if not self.server_sessions:
            self.local = self.local[:keep]
        else:
            self.client.post(f"/v1/sessions/{seg(self.session)}/rollback", {"keep_messages": keep})

    def retry(self, _: str) -> None:
        messages = self.messages()
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise CLIError("nothing to retry: the session has no user message yet")
        text = _text(messages[users[-1]].get("content"))
        self._cut(users[-1])
        self.say(text)

    def _edited(self, arg: str, verb: str) -> tuple[int, str]:
        """(the message's 0-based index, the new text) for `/edit N [TEXT]` and `/branch N [TEXT]`."""
        number, _, text = arg.partition(" ")
        if not number.isdigit() or int(number) < 1:
            raise CLIError(f"usage: /{verb} N [TEXT] (N: a user message, numbered as in /history)")
        messages = self.messages()
        index = int(number) - 1
        if index >= len(messages) or messages[index].get("role") != "user":
            raise CLIError(f"message {number} is not a user message (see /history)")
        text = text.strip() or self.read_edit(_text(messages[index].get("content")))
        if not text:
            raise CLIError("empty message: nothing changed")
        return index, text

    def edit(self, arg: str) -> None:
        index, text = self._edited(arg, "edit")
        self._cut(index)
        self.say(text)

    def branch(self, arg: str) -> None:
        """The page's Branch: save, load into a new session, cut that one back, delete the snapshot."""
        self._needs_sessions()
        index, text = self._edited(arg, "branch")
        parent, name = self.session, new_session_name()
        with self.out.status("branching…"):
            snap = self.client.post(f"/v1/sessions/{seg(parent)}/save", {"title": f"branch point: {parent}",
                                                                         "tags": ["branch"]})
            snap_id = str(snap["snapshot_id"])
            try:
                self.client.post(f"/v1/snapshots/{seg(snap_id)}/load", {"session_id": name})
            finally:
                with contextlib.suppress(CLIError):  # a server with an admin key keeps it (tagged "branch")
                    self.client.delete(f"/v1/snapshots/{seg(snap_id)}")
            cut = self.client.post(f"/v1/sessions/{seg(name)}/rollback", {"keep_messages": index})
        self.session = name
        self.out.print(f"branched into session {name} ({cut.get('current_pos', '?')} tokens of messages "
                       f"1-{index} reused); {parent} is kept", markup=False)
        self.say(text)

    def read_edit(self, old: str) -> str:
        """The old text on the prompt line, to be edited (with readline; without, typed anew)."""
        try:
            import readline
        except ImportError:
            return input("edit> ").strip()
        readline.set_startup_hook(lambda: readline.insert_text(old.replace("\n", " ")))
        try:
            return input("edit> ").strip()
        finally:
            readline.set_startup_hook()

    def history(self, _: str) -> None:
        print_history(self.out, self.messages())

    def set_system(self, text: str) -> None:
        if not text:
            self.out.print(f"system message: {self.system!r}" if self.system else "no system message set")
            return
        self.system, self.replace_system = text, True
        self.out.print("system message set; it applies from the next turn")

    def clear(self, _: str) -> None:
        self.session, self.local = new_session_name(), []
        self.replace_system = bool(self.system)
        self.out.print(f"new session {self.session}")

    def sessions(self, _: str) -> None:
        self._needs_sessions()
        self.out.print(sessions_table(self.client.get("/v1/sessions")["data"]))

    def snapshots(self, _: str) -> None:
        self._needs_sessions()
        self.out.print(snapshots_table(self.client.get("/v1/snapshots")["data"]))

    def stats(self, _: str) -> None:
        self.out.print(self.last.describe() if self.last else "no turn yet")

    # the loop

    def read_message(self) -> str:
        """One message: lines ending in a backslash continue on the next line."""
        lines = []
        prompt = PROMPT
        while True:
            line = input(prompt)
            if line.endswith("\\"):
                lines.append(line[:-1])
                prompt = CONTINUE
                continue
            lines.append(line)
            return "\n".join(lines).strip()

    def run(self) -> None:
        while True:
            try:
                text = self.read_message()
            except EOFError:
                self.out.print()
                return
            except KeyboardInterrupt:
                self.out.print()  # Ctrl-C at the prompt drops the line, like a shell
                continue
            if not text:
                continue
            try:
                if text.startswith("/"):
                    self.command(text)
                else:
                    self.say(text)
            except CLIError as e:
                self.err.print(Text(f"error: {e}", style="red"))
            except KeyboardInterrupt:  # Ctrl-C during a slash command: drop it, stay
                self.out.print(Text("[interrupted]", style="yellow"))


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def connect(url: str | None, api_key: str | None) -> Client:
    """A client for `url`; when none was given with --url and nothing answers at a loopback
    address, start a background server there (as `hearth server start` does) and wait."""
    explicit = url is not None
    client = Client(resolve_url(url), api_key)
    state = client.health()
    if state == "ok":
        return client
    parsed = urlparse(client.url)
    if state == "down":
        if explicit or not parsed.hostname or not is_loopback(parsed.hostname):
            raise CLIError(f"no Hearth server answers at {client.url} (start one with: hearth server start)")
        info = start_server(Daemon(), ServeOptions(host=parsed.hostname, port=parsed.port or 80))
        typer.echo(f"started a background server at {info['url']} (pid {info['pid']}; "
                   "stop it with: hearth server stop)", err=True)
        return client
    deadline = time.monotonic() + 300
    while state == "loading" and time.monotonic() < deadline:
        time.sleep(0.5)
        state = client.health()
    if state != "ok":
        raise CLIError(f"the server at {client.url} is not ready: {state}")
    return client


@cli_errors
def chat(
    session: Annotated[str | None, typer.Option(
        "--session", "-s", help="Session to use or resume (default: a new generated name).")] = None,
    system: Annotated[str | None, typer.Option("--system", help="System message for the conversation.")] = None,
    url: Annotated[str | None, typer.Option(
        "--url", help="Server URL (env HEARTH_URL, default http://127.0.0.1:8000, where a server is started "
        "if none answers).", show_default=False)] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="HEARTH_API_KEY", help="API key, if the server needs one.", show_default=False)] = None,
    model: Annotated[str | None, typer.Option(help="Model id (default: the server's first).")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Most tokens per reply.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    plain: Annotated[bool, typer.Option(
        "--plain", help="Print answers as raw text, not rendered as markdown.")] = False,
) -> None:
    """Chat with a model in the terminal, in a server session.

    Replies stream, rendered as markdown (--plain: raw text); Ctrl-C stops one (the REPL stays),
    Ctrl-D leaves. Type /help inside for the slash commands (/retry, /edit N, /branch N, ...).
    Without --url, a server is started in the background if none answers.

    Example: hearth chat --session demo --system "Answer briefly."
    """
    if session is not None and not is_session_id(session):
        raise CLIError(f"invalid session name {session!r}: use 1-128 of A-Z a-z 0-9 . _ -", 2)
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    interactive_sigint()
    out = Console(highlight=False, soft_wrap=True)
    client = connect(url, api_key)
    with client:
        model_ids = [m["id"] for m in client.get("/v1/models")["data"]]
        try:
            client.get("/v1/sessions")
            server_sessions = True
        except APIError as e:
            if e.status != 404:
                raise
            server_sessions = False
        repl = Repl(client, out, api_key, session or new_session_name(), system=system,
                    replace_system=system is not None, max_tokens=max_tokens, temperature=temperature,
                    model=model, server_sessions=server_sessions, markdown=not plain)
        out.print(f"hearth chat · {model or (model_ids[0] if model_ids else '?')} at {client.url}", markup=False)
        if not server_sessions:
            out.print("this server has no sessions: the conversation is kept in this REPL only", style="yellow")
        elif session:
            resume(repl)
        else:
            out.print(f"session {repl.session} (resume it with: hearth chat --session {repl.session})",
                      markup=False)
        out.print("/help for commands, Ctrl-C stops a reply, Ctrl-D leaves", style="dim")
        repl.run()


def resume(repl: Repl) -> None:
    try:
        s = repl.client.get(f"/v1/sessions/{seg(repl.session)}")
    except APIError as e:
        if e.status != 404:
            raise
        repl.out.print(f"session {repl.session} (new)", markup=False)
        return
    repl.out.print(f"session {repl.session}: resuming, {s.get('message_count', 0)} messages, "
                   f"{s.get('current_pos', 0)} tokens in the KV cache (/history shows them)", markup=False)
