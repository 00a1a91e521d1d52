/* llama.cpp's abort callback (ggml_abort_callback), called by the compute thread after every
 * graph node. It only reads one int that any thread may set. A ctypes callback would take the
 * GIL once per node (hundreds per llama_decode), racing the event loop for it; this does not.
 * Built by scripts/setup.sh (hearth.backends.llamacpp.abort_flag) and cached under ~/.cache/hearth/native. */
#include <stdbool.h>

bool hearth_abort_requested(void *flag) {
    return __atomic_load_n((const int *)flag, __ATOMIC_RELAXED) != 0;
}
