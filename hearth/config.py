"""Server settings: one place, filled from CLI flags and HEARTH_* environment variables."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from hearth.tenants import ApiKey, bare_key, check_keyring

KV_TYPES = ("f16", "q8_0", "q4_0")  # llama.cpp KV cache element types Hearth offers


def default_data_dir() -> Path:
    home = os.environ.get("HEARTH_HOME")
    return Path(home) if home else Path(platformdirs.user_data_dir("hearth"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_access(host: str, api_keys: list[str], insecure: bool, key_flags: str) -> None:
    """The access rules of a node and of the gateway alike: no empty API key, and no bind past
    loopback without one unless `insecure` says to serve it open. `key_flags` names the flags
    that give a key, for the message. ValueError when a rule is broken."""
    if any(not k.strip() for k in api_keys):
        raise ValueError("API keys must not be empty")
    if not is_loopback(host) and not api_keys and not insecure:
        raise ValueError(f"refusing to bind {host} (not loopback) without an API key: give {key_flags}, "
                         "or --insecure to serve it open")


LOOPBACK = "loopback"  # the default CORS origins: localhost, 127.0.0.1, [::1], http(s), any port
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+")  # scheme://host[:port], nothing after


def parse_origins(text: str) -> list[str]:
    """`--cors-origins` as a list: comma-separated, blanks dropped ("" is an empty list: CORS off)."""
    return [o.strip() for o in text.split(",") if o.strip()]


def check_origins(origins: Sequence[str]) -> None:
    """ValueError for a CORS entry that could never match a browser's Origin header."""
    for o in origins:
        if o not in ("*", LOOPBACK) and not _ORIGIN.fullmatch(o.lower()):
            raise ValueError(f"--cors-origins: {o!r} is not an origin: write scheme://host[:port] (no path, "
                             f"no trailing slash), one with * in its host, {LOOPBACK!r}, or *")


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str | float | int) -> float:
    """A keep-alive as Ollama takes it: a number of seconds, or a duration (`90s`, `5m`, `1h`,
    `1h30m`); negative means forever (returned as inf), 0 now. ValueError if it is neither."""
    if isinstance(text, bool):
        raise ValueError("a duration is a number of seconds or a string such as 5m")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        s = text.strip().lower()
        pos, seconds, parts = 0, 0.0, 0
        sign = -1.0 if s.startswith("-") else 1.0
        s = s.lstrip("-")
        while pos < len(s):
            m = _DURATION.match(s, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"{text!r} is not a duration: write seconds (300), or 90s, 5m, 1h, 1h30m, -1")
            seconds += float(m.group(1)) * _UNIT[m.group(2)]
            pos, parts = m.end(), parts + 1
        if not parts:
            raise ValueError(f"{text!r} is not a duration: write seconds (300), or 90s, 5m, 1h, 1h30m, -1")
        seconds *= sign
    if seconds != seconds:  # NaN
        raise ValueError("a duration must be a number")
    return float("inf") if seconds < 0 else seconds


@dataclass(slots=True)
class Settings:
    # --model: loaded at start and kept loaded; empty: the default model, loaded at start, which
    # then follows the keep-alive and --models-max like every other model servable on demand
    models: list[str] = field(default_factory=list)
    models_dir: Path | None = None  # GGUF files here are servable on demand too
    models_max: int = 4  # models in memory at once (llama-server's --models-max)
    models_ram_mb: int = 0  # what loaded models may take together, measured per load; 0: no budget
    # Seconds an idle model stays loaded. Forever by default, unlike Ollama's 5m: a server that
    # keeps conversations warm does not drop a model (and its slots' KV) because nobody spoke for
    # five minutes; models leave when --models-max or --models-ram-mb needs the room, as in
    # llama-server's router mode, or when a keep-alive (--keep-alive, a request's) says so.
    keep_alive: float = float("inf")
    host: str = "127.0.0.1"
    port: int = 8000
    ctx: int | None = None  # tokens per sequence; None: the model's training context
    parallel: int = 4
    threads: int | None = None
    batch: int = 512
    kv_unified: bool = False
    kv_type: str = "f16"  # f16 | q8_0 | q4_0
    spec_draft: int = 8  # prompt-lookup speculative decoding: most drafted tokens per step (0: off)
    tool_parser: str = "auto"  # auto | hermes | llama3 | mistral | pythonic | json (checked by the backend)
    data_dir: Path = field(default_factory=default_data_dir)
    session_ram_mb: int = 2048  # host RAM for swapped-out session KV; past it, KV spills to disk
    prompt_cache_mb: int = 1024  # host RAM for the prompt cache (stateless prompts' KV, in blocks)
    prompt_cache_disk_mb: int = 8192  # disk for the prompt cache under data_dir/prompt-cache (0: RAM only)
    log_level: str = "info"
    log_format: str = "text"  # text | json
    # admission and time caps
    max_waiting: int = 64
    batch_concurrency: int = 2  # batch lines (the Batch API) running at once, all batches together
    max_wait: float = 60.0
    request_timeout: float = 600.0  # default cap on a request's generation, seconds from its first token
    # A max_tokens past the context: a 400 (OpenAI's) when strict, else lowered to what is left (llama-server's).
    strict_max_tokens: bool = False
    sse_heartbeat: float = 5.0  # seconds of silence on a stream before a heartbeat (SSE comment / ping)
    max_request_timeout: float = 3600.0  # the most a request may ask for
    repetition_detection: bool = False  # stop looping generations unless a request says otherwise
    lenient_tool_calls: bool = True  # take tool calls written as bare/fenced JSON unless a request says otherwise
    # access
    api_keys: list[str] = field(default_factory=list)  # bare keys (--api-key): each a tenant of its own
    named_keys: list[ApiKey] = field(default_factory=list)  # from --api-key-file (hearth.tenants)
    api_key_file: Path | None = None  # where named_keys came from: reloaded on SIGHUP (hearth/http/keyring.py)
    admin_key: str | None = None
    metrics_token: str | None = None
    metrics_public: bool = False
    insecure: bool = False
    cors_origins: list[str] = field(default_factory=lambda: [LOOPBACK])  # hearth/http/cors.py; []: off
    # observability
    usage_ledger: bool = True  # one row per request in data_dir/usage.db (hearth.observability.ledger)
    otlp_endpoint: str | None = None  # OTLP/HTTP collector for traces (also OTEL_EXPORTER_OTLP_*); None: off
    trace_content: bool = False  # prompts and answers in spans
    journal: bool = False  # keep request bodies and answers for `hearth replay` (hearth.observability.journal)
    journal_max_age: float = 30 * 86400.0  # seconds a journal record is kept
    journal_max_mb: int = 1024  # compressed journal contents kept at most (the oldest go first)

    def __post_init__(self) -> None:
        if not 1 <= self.parallel <= 256:
            raise ValueError("--parallel must be between 1 and 256")
        if self.ctx is not None and self.ctx < 16:
            raise ValueError("--ctx must be at least 16")
        if self.batch < self.parallel:
            raise ValueError("--batch must be at least --parallel")
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"--kv-type must be one of {', '.join(KV_TYPES)}")
        if not 0 <= self.spec_draft <= 64:
            raise ValueError("--spec-draft must be between 0 and 64")
        if self.threads is not None and self.threads < 1:
            raise ValueError("--threads must be at least 1")
        if not 0 < self.port < 65536:
            raise ValueError("--port must be in 1..65535")
        if self.log_format not in ("text", "json"):
            raise ValueError("--log-format must be text or json")
        if self.session_ram_mb < 0 or self.prompt_cache_mb < 0 or self.prompt_cache_disk_mb < 0:
            raise ValueError("--session-ram-mb, --prompt-cache-mb and --prompt-cache-disk-mb must be >= 0")
        if self.max_waiting < 0 or self.max_wait <= 0:
            raise ValueError("--max-waiting must be >= 0 and --max-wait > 0")
        if not self.sse_heartbeat > 0:
            raise ValueError("--sse-heartbeat must be > 0 seconds")
        if not 0 < self.request_timeout <= self.max_request_timeout:
            raise ValueError("--request-timeout must be > 0 and at most --max-request-timeout")
        if self.models_max < 1:
            raise ValueError("--models-max must be at least 1")
        if self.models_ram_mb < 0:
            raise ValueError("--models-ram-mb must be >= 0 (0: no budget)")
        if self.models_max < len(self.models):
            raise ValueError(f"--models-max {self.models_max} is less than the {len(self.models)} models named "
                             "with --model (each is kept loaded)")
        if not self.keep_alive >= 0:
            raise ValueError("--keep-alive must be >= 0 (or negative on the command line: forever)")
        if self.models_dir is not None and not self.models_dir.is_dir():
            raise ValueError(f"--models-dir {self.models_dir} is not a directory")
        check_access(self.host, [*self.api_keys, *(k.key for k in self.named_keys)], self.insecure,
                     "--api-key (or --api-key-file)")
        check_keyring(self.keyring)
        check_origins(self.cors_origins)

    @property
    def keyring(self) -> list[ApiKey]:
        """Every API key with its name and tenant: the bare ones first, then the key file's."""
        return [*(bare_key(k) for k in dict.fromkeys(self.api_keys) if k.strip()), *self.named_keys]
