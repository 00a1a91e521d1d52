"""The OpenAI Batch API on a node: /v1/files (JSONL input and output files) and /v1/batches,
run by a durable in-process runner (docs/api.md, "Batches")."""
