"""The node's side of a run over HTTP, shared by its protocols: the life of a run (`runs`,
`cancels`), the per-run fields and stream shaping every generating protocol accepts
(`run_options`, `stream_shaping`) and what a finished run records (`usage_tap`). The edge both
the node and the gateway use (keys, bodies, errors, SSE) is `hearth.http`."""
