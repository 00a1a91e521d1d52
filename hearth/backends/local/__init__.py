"""The local backend family: models served by engines in this process.

`backend.LocalBackend` is the `Backend` (template → tokens → engine → events); `model.LocalModel`
is one loaded model and the settings it is built from; `events` turns an engine run into
ChatEvents; `kv` is the session-KV capability; `admission` the bounded queue in front of the
slots; `prompt_size` refuses text too long to tokenize. The runner under the engine comes from
`hearth.backends.llamacpp` (or a fake, in the tests).
"""
