"""OpenAI's protocols: Chat Completions (`chat`), legacy Completions (`completions`) and the
Responses API (`responses`, with its input items, output events and stored responses in the
`responses_*` modules)."""
