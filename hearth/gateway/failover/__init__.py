"""What happens when a node fails. Before the client's first byte: retry.py (which failures go
to another node, and the error once all failed). After it: resume.py (a Hearth node's stream
continued on another node, with the protocol's cut: cuts/), openai.py (the same for openai-kind
engines, as text; resume.py says why two levels). Between turns: restore.py (a session or a
response chain made present on another node), record.py (a turn recorded from what was relayed
when the node died before its transcript was copied)."""
