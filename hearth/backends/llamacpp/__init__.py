"""The llama.cpp family: the engine's `Runner` over llama-cpp-python's low-level (ctypes) API.

`runner.LlamaCppRunner` owns the model, the context and the batch; `sampler.NativeSampler` is a
llama.cpp sampler chain for one sequence; `state` is the byte layout of a sequence's saved KV;
`abort_flag` (with `abort_flag.c`) lets any thread stop a running decode.
"""
