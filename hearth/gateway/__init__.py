"""The gateway: one front door over a fleet of Hearth nodes and OpenAI-compatible engines
(docs/gateway.md). `config` reads the fleet, `routing` picks a node, `health` decides who is
alive, `proxy` runs a generation turn (`retry` says when another node is tried, `relay` streams
the answer back and ends broken streams in their protocol), `transcripts`
keeps every session's conversation, `migrate` moves a session with its KV, `app` ties it up."""
