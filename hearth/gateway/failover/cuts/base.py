"""Stream migration: an answer whose Hearth node broke after the client's first byte goes on
on another node, and the client sees one uninterrupted stream.

A `Cut` follows a stream as it is relayed (`feed`: every event the client gets) and knows
the answer so far in its protocol's terms: text, reasoning, tool calls with their ids, names
and (partial) arguments; content block indexes on Messages; items, output indexes and
sequence numbers on Responses. When the node breaks, `body` is the request to send to another
node: the same request plus that partial answer as the final assistant message, with
`continue_final_message: true` (docs/api.md, "Continuing a partial answer"). The other node
sends only what is new; `rewrite` turns each of its events into what the client gets:
the first answer's ids, its opening events dropped (role chunk / message_start /
response.created, and the block or item that goes on), indexes and sequence numbers
continuous, one finish. Usage needs nothing: the continuation is sent with `partial_is_output`,
so it counts the partial answer in its completion tokens, leaves it out of its prompt tokens
and takes it off max_tokens.

`begin()` is called before each continuation (a stream may move more than once).
"""

from __future__ import annotations

from typing import Any

from hearth.gateway.protocols import Event

# The node's field that counts the continued message as this answer's output (docs/api.md,
# "Continuing a partial answer"): a client's own prefill counts as input, but the part this
# answer already produced keeps its place in max_tokens and in the completion tokens.
PARTIAL_IS_OUTPUT = "partial_is_output"


class Cut:
    """What the client has been sent of one streamed answer; see the module docstring."""

    def feed(self, event: Event) -> None:
        raise NotImplementedError

    def body(self, request: dict[str, Any], whole: bool = False) -> dict[str, Any] | None:
        """The continuation request, or None when this answer cannot be continued. `whole`: also
        when it ended (the request that holds the whole answer, for failover/record.py)."""
        raise NotImplementedError

    def begin(self) -> None:
        raise NotImplementedError

    def rewrite(self, event: Event) -> list[Event]:
        raise NotImplementedError
