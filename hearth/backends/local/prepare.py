"""A request made ready for the engine, in the local backend's worker pool (never on the event
loop: a long prompt takes seconds to render and tokenize): the chat template rendered, the
prompt tokenized, the grammar, the thinking budget and the output parsers built, the token ids
and the engine's own limits checked. Every refusal here is a BadRequest (or ContextLimit): a
4xx before the stream starts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from hearth.backends.local.model import LocalModel
from hearth.backends.local.prefix_tokens import split_at_special
from hearth.chat import continuation
from hearth.chat.output import OutputParser
from hearth.chat.reasoning import ReasoningParser, opens_thinking, template_kwargs
from hearth.chat.system_turns import place_system_turns
from hearth.chat.tools import OutputPlan, as_text_messages, plan_output
from hearth.chat.types import ChatRequest
from hearth.engine import EngineRequest
from hearth.engine.kv import common_prefix_len
from hearth.engine.thinking import ThinkBudget
from hearth.engine.types import ContextOverflow, SamplingParams
from hearth.errors import BadRequest, ContextLimit

log = logging.getLogger("hearth.backend")


@dataclass(slots=True)
class Prepared:
    """A chat request made ready for the engine (built in a worker thread)."""

    tokens: list[int]
    params: SamplingParams
    think: ThinkBudget | None
    parsers: list[OutputParser]
    keep_tokens: int = 0  # prompt tokens up to the client's last cache_control breakpoint
    # Tokens of a continued partial answer at the prompt's end that are this answer's own output
    # (`partial_is_output`: the gateway's continuation): completion tokens, not prompt tokens.
    prefilled: int = 0


def render(m: LocalModel, req: ChatRequest, plan: OutputPlan, *, generation_prompt: bool = True) -> str:
    kwargs = template_kwargs(req)
    messages = place_system_turns(req.messages, m.late_system)
    if m.native_tools:
        return m.template.render(messages, tools=plan.tools_in_prompt or None,
                                 add_generation_prompt=generation_prompt, kwargs=kwargs)
    return m.template.render(as_text_messages(messages, plan.tools_in_prompt),
                             add_generation_prompt=generation_prompt, kwargs=kwargs)


def render_chat(m: LocalModel, req: ChatRequest) -> str:
    return render(m, req, plan_output(req, m.tool_parser))


def prepare(m: LocalModel, req: ChatRequest) -> Prepared:
    """Template, tokens, grammar and parsers for a chat request; a BadRequest if any is bad."""
    plan = plan_output(req, m.tool_parser)
    partial = continuation.check(req) if req.continue_final else None
    text = render(m, replace(req, messages=req.messages[:-1]) if partial else req, plan)
    start, end = m.think
    inside = opens_thinking(text, start)
    prefill = continuation.prefill_text(partial, m.think, inside, plan.parser) if partial else ""
    # The rendered template carries its own special tokens (BOS included, when it wants one).
    tokens = m.tokenize_text(text + prefill, False)
    # A client's prefill is input (Anthropic's meaning): prompt tokens, and max_tokens bounds
    # the new tokens. The gateway's continuation of a cut stream (`partial_is_output`) keeps the
    # answer's original budget and counts: there the partial part is completion (docs/api.md).
    output_prefill = bool(prefill) and req.partial_is_output
    prefilled = max(0, len(tokens) - len(m.tokenize_text(text, False))) if output_prefill else 0
    params = constrain(m, req.sampling, plan.grammar, "tool_choice" if plan.parser else "response_format")
    if prefilled and params.max_tokens is not None:  # max_tokens bounds the whole answer, both parts
        params = replace(params, max_tokens=max(1, params.max_tokens - prefilled))
    if partial and params.grammar is not None:
        raise BadRequest("a partial answer cannot be continued under a grammar (response_format, a forced "
                         "tool_choice or grammar): it constrains the answer from its start",
                         param=continuation.PARAM)
    think = None
    if req.reasoning.budget is not None:
        try:
            think = ThinkBudget(req.reasoning.budget, m.tokenize_text(end, False), start.encode(), end.encode(),
                                starts_inside=inside)
        except ValueError as e:
            raise BadRequest(str(e), param="reasoning_budget") from e
    # Under a grammar the output is JSON or a forced call, never thinking.
    parsers = [OutputParser(i, None if params.grammar else ReasoningParser(start, end, inside=inside),
                            plan.tool_parser(req.tools), req.parallel_tool_calls)
               for i in range(req.n)]
    if prefill:
        continuation.prefill_parsers(parsers, prefill)
    return Prepared(tokens, params, think, parsers, keep_tokens(m, req, plan, text + prefill, tokens), prefilled)


def keep_tokens(m: LocalModel, req: ChatRequest, plan: OutputPlan, text: str, tokens: list[int]) -> int:
    """How many of the prompt's `tokens` (the tokens of `text`) end with message
    `req.cache_through` (the client's last cache_control breakpoint): the prompt rendered up
    to that message, with the same tools and no generation prompt, compared token by token
    with the whole one. Comparing rather than trusting the render keeps it a true prefix
    whatever the template does to a conversation's last message. Only the text from the last
    special token before the breakpoint is tokenized again where that gives the same number
    (hearth.backends.local.prefix_tokens), else the whole prefix. 0 when nothing is asked, or
    for a session (its KV is its own, never offered to the prompt cache)."""
    through = req.cache_through
    if through is None or req.session is not None or not req.cache_prompt:
        return 0
    try:
        prefix = render(m, replace(req, messages=req.messages[:through + 1]), plan, generation_prompt=False)
    except BadRequest as e:  # a template that refuses a conversation cut short: keep nothing
        log.debug("%s: no cache breakpoint: the template refused the prefix: %s", req.request_id, e)
        return 0
    split = split_at_special(m.runner, tokens, text, prefix)
    if split is None:
        return common_prefix_len(m.tokenize_text(prefix, False), tokens)
    i, rest = split
    return i + common_prefix_len(m.tokenize_text(rest, False), tokens[i:])


def constrain(m: LocalModel, sampling: SamplingParams, grammar: str | None, source: str) -> SamplingParams:
    """Sampling with the plan's grammar, checked now so a bad one is a 400, not an error later."""
    if grammar is not None and sampling.grammar is not None:
        raise BadRequest("a grammar cannot be combined with response_format or a forced tool_choice",
                         param="grammar")
    params = replace(sampling, grammar=grammar) if grammar is not None else sampling
    if params.grammar is not None:
        try:
            m.runner.check_grammar(params.grammar)
        except ValueError as e:
            raise BadRequest(str(e), param="grammar" if sampling.grammar else source) from e
    return params


def checked(m: LocalModel, tokens: list[int], param: str = "tokens") -> list[int]:
    """`tokens` once every id is in the vocabulary (linear: call it off the loop)."""
    n_vocab = m.runner.n_vocab
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is out of range [0, {n_vocab})", param=param)
    return tokens


def validate(m: LocalModel, ereq: EngineRequest, param: str, strict_max_tokens: bool) -> None:
    """The engine's checks, once, in the worker pool (they scan the prompt): a 4xx before the
    stream is returned, and the engine is told not to repeat them (`validated=True`). A
    max_tokens past the context is lowered to what the context leaves (llama-server's and
    Ollama's way: the window then ends the output with "length"), or refused when strict."""
    try:
        try:
            m.engine.validate(ereq)
        except ContextOverflow as e:
            if strict_max_tokens or e.max_tokens is None or e.n_prompt >= e.limit:
                raise
            ereq.params = replace(ereq.params, max_tokens=e.limit - e.n_prompt)
            m.engine.validate(ereq)
    except ContextOverflow as e:
        raise ContextLimit(str(e), n_prompt=e.n_prompt, limit=e.limit, max_tokens=e.max_tokens,
                           param=param) from e
    except ValueError as e:
        raise BadRequest(str(e)) from e
