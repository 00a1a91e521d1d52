"""A/B benchmark: servers run side by side and take turns on the same requests (A, B, A, B, …),
so the machine's drift hits both alike; every ratio is taken pair by pair. `python -m bench.ab`."""
