"""One generation request, first byte to last: request.py (`Turn`, `read_turn`), proxy.py (the
attempt loop), send.py (the turn sent to one node), relay.py (its stream to the client), scan.py
(what is read from it in passing), after.py (what is recorded once it succeeded)."""
