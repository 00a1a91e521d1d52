"""The HTTP edge both products share, the node (`hearth.api`) and the gateway (`hearth.gateway`):
who may call (`access`, `auth`), each key's limits (`key_usage`), bounded bodies (`body`) and their
parsing into typed values (`parsing`), the one error policy (`errors`), CORS (`cors`), server-sent
events (`sse`), conversation keys (`cache_keys`) and the Starlette app both assemble (`app`).
Nothing here knows a protocol's shapes, a backend or the gateway's fleet."""
