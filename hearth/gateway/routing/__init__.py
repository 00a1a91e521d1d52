"""Which node serves a request, decided without I/O: affinity.py (the conversation a request belongs
to, and `key_of`, the one spelling of a store key), prefixes.py (what a node has been sent of a
conversation), policy.py (the cost model, `Chooser`, and `least_loaded`)."""
