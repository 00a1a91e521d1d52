"""The HTTP machinery every protocol shares, and the gateway with them: API keys (`auth`),
bounded bodies (`body`) and their parsing into typed values (`parsing`), the one error policy
(`errors`), server-sent events (`sse`), the life of a run on the HTTP side (`runs`, `cancels`)
and the per-run fields and stream shaping every generating protocol accepts (`run_options`,
`stream_shaping`). Nothing here knows a protocol's shapes."""
