"""HTTP in and out; decides nothing, remembers nothing: generate.py, resources.py (sessions,
snapshots, responses, cancel), admin.py, models.py (/v1/models, /health), forward.py (pass-through
to a node), delegate.py (hand-off to the translating layer), ollama.py (Ollama's /api/*), common.py."""
