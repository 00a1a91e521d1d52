"""Protocol facts both products speak, the node (`hearth.api`) and the gateway (`hearth.gateway`):
the Responses API's replayable event log and its errors (`responses_log`), Anthropic's stream
error event (`anthropic_events`), Ollama's model names (`ollama_names`) and stream type and
version (`ollama_wire`). A protocol's request readers and serializers stay with the node's
handlers (`hearth.api.*`)."""
