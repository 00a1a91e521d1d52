"""openai-kind upstreams (vLLM, SGLang, llama-server) behind the node's own protocol layer: backend.py
(`OpenAIUpstreamBackend`, a `Backend` the node's app serves) and wire.py (OpenAI chat to and from
those engines)."""
