"""`python -m bench.prompt_cache.keep_tokens`: what a cache_control breakpoint costs a request's
preparation (issue 38: a long prompt tokenized once per request, not twice).

    .venv/bin/python -m bench.prompt_cache.keep_tokens --rounds 20
    .venv/bin/python -m bench.prompt_cache.keep_tokens --model default --fixtures claude-code-first

In process, no server: the model's tokenizer and chat template (qwen2.5-coder-0.5b unless
`--model`; `default` is SmolLM2), each Claude Code fixture's request as the Messages API reads
it, and, alternated round by round, the two ways of finding `keep_tokens` from the prompt's
tokens: `prefix` (the prompt rendered up to the breakpoint and tokenized whole, as before)
and `split` (hearth.backends.local.prepare.keep_tokens today: only the text from the last
special token before the breakpoint is tokenized again). Also the whole `prepare` (render,
tokenize, parsers, keep_tokens) and one tokenization of the whole prompt, for scale. Both ways
must give the same number (checked every round). Prints medians in ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FIXTURES = ("claude-code-first", "claude-code-bash-first", "claude-code-bash-after-tool")


def main(argv: list[str] | None = None) -> None:
    from bench.agents import default_model, load_fixture
    from hearth.api.anthropic.messages import read_messages
    from hearth.backends.local.model import EngineSettings, LocalModel, llamacpp_factory
    from hearth.backends.local.prepare import keep_tokens, prepare, render
    from hearth.backends.local.prompt_size import longest_token
    from hearth.chat.reasoning import think_markers
    from hearth.chat.system_turns import renders_late_system
    from hearth.chat.tools import knows_tools, plan_output, resolve_parser
    from hearth.engine.kv import common_prefix_len
    from hearth.models import ModelSpec, embedded_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF path, or `default` (SmolLM2); default qwen2.5-coder-0.5b")
    ap.add_argument("--fixtures", default=",".join(FIXTURES))
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args(argv)
    path = embedded_model_path() if a.model == "default" else Path(a.model) if a.model else default_model()
    settings = EngineSettings(ctx=64, parallel=1, threads=1, batch=16)  # the vocabulary is what counts
    runner, _, template = llamacpp_factory(ModelSpec("m", path), settings)
    engine: Any = SimpleNamespace(seq_ctx=runner.n_ctx_train)
    m = LocalModel(ModelSpec("m", path), runner, engine, template, card=None, admission=None,  # type: ignore[arg-type]
                   longest_token=longest_token(runner), tool_parser=resolve_parser("auto", template),
                   native_tools=knows_tools(template), late_system=renders_late_system(template),
                   think=think_markers(template.source))
    print(f"model {path.name}, {a.rounds} rounds, medians in ms")
    for name in a.fixtures.split(","):
        req = read_messages(load_fixture(name)["body"], "req-bench")[1]
        assert req.cache_through is not None
        plan = plan_output(req, m.tool_parser)
        text = render(m, req, plan)
        tokens = m.tokenize_text(text, False)
        times: dict[str, list[float]] = {"tokenize": [], "prefix": [], "split": [], "prepare": []}
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            m.tokenize_text(text, False)
            t1 = time.perf_counter()
            head = render(m, replace(req, messages=req.messages[:req.cache_through + 1]), plan, generation_prompt=False)
            old = common_prefix_len(m.tokenize_text(head, False), tokens)
            t2 = time.perf_counter()
            new = keep_tokens(m, req, plan, text, tokens)
            t3 = time.perf_counter()
            prepare(m, req)
            t4 = time.perf_counter()
            if old != new:
                raise SystemExit(f"{name}: keep_tokens {new} but the prefix's tokens give {old}")
            for key, dt in (("tokenize", t1 - t0), ("prefix", t2 - t1), ("split", t3 - t2), ("prepare", t4 - t3)):
                times[key].append(dt * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name:28} {len(tokens):6} tokens, keep {new:6}: tokenize whole {med['tokenize']:6.2f}  "
              f"keep_tokens before {med['prefix']:6.2f}  now {med['split']:5.2f}  (prepare now {med['prepare']:6.2f})")
    runner.close()


if __name__ == "__main__":
    main()
