"""The OpenAI Batch API through the gateway (docs/gateway.md, "Batches"): state in the gateway's
store (store/batches.py), lines run through the gateway's own turn path (runner.py)."""
