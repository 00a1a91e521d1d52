"""Protocol facts both products speak, the node (`hearth.api`) and the gateway (`hearth.gateway`):
the Responses API's replayable event log and its errors (`responses_log`) and its input items as
messages (`responses_input`, which the gateway also reads to record a turn), Anthropic's stream
error event (`anthropic_events`), Ollama's model names (`ollama_names`) and stream type and
version (`ollama_wire`). The Chat and Messages body readers stay with the node's handlers
(`hearth.api.openai.chat.read_chat`, `hearth.api.anthropic.messages.read_messages`): they build
a ChatRequest with the node's run options, and the gateway's `failover/record.py` reuses them."""
