#!/usr/bin/env bash
# Set up (idempotent) and start Hearth on the embedded default model at 127.0.0.1:8000.
# Extra arguments go to `hearth serve`, e.g. scripts/serve.sh --parallel 8 --port 9000
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
exec "$root/.venv/bin/hearth" serve "$@"
