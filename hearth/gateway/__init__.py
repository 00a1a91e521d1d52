"""The gateway: one front door over a fleet of Hearth nodes and OpenAI-compatible engines
(docs/gateway.md). `config` reads the fleet, `routing` picks a node, `health` decides who is
alive, `proxy` runs a generation turn (`retry` says when another node is tried, `relay` streams
the answer back and ends broken streams in their protocol), `routes` answer the rest (`forward`
passes a request through to a node), `transcripts` keeps every session's conversation, `migrate`
moves a session with its KV, `context` is what the routes see, `app` ties it up."""
