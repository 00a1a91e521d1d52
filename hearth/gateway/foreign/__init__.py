"""openai-kind upstreams (vLLM, SGLang, llama-server) behind the node's own protocol layer: backend.py
(`OpenAIUpstreamBackend`, a `Backend` the node's app serves), stream.py (one answer, continued
elsewhere when its engine breaks), wire.py (OpenAI chat to and from those engines) and turn.py
(each turn's row in the gateway's usage ledger and its spans)."""
