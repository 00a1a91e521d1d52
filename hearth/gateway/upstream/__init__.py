"""Talking to a node: the fast HTTP/1.1 client for generation requests (http.py: `Answer`, `Sender`,
`within`) and which headers go to a node and which come back (headers.py)."""
