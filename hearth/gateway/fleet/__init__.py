"""Which nodes exist and how each one is doing: pool.py (the node table and admission: acquire,
release, the wait queue), probes.py (the liveness probe loop), health.py (liveness and the
breaker), cache_state.py and digests.py (what each node's prompt cache holds), membership.py
(nodes joining, lapsing, the fleet file reloaded), moves.py (a session moved with its KV, drain),
leases.py (several gateways on one database)."""
