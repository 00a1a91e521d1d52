"""The durable prompt cache against llama-server (issue 24): restarts, second conversations, the
disk tier's speed and the disk shared prefixes take. `python -m bench.prompt_cache`."""
