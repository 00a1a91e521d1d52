"""Ollama's native API (`/api/*`) on the node's own port: requests parsed at the edge into the
protocol-neutral `ChatRequest`, events serialised back as Ollama's NDJSON lines."""
