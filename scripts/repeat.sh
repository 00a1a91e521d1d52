#!/usr/bin/env bash
# Run pytest N times in a row and stop at the first failure: the check that a test's verdict does
# not depend on chance. Usage: scripts/repeat.sh N -- <pytest args>
#   scripts/repeat.sh 10 -- -q tests/agents
# Prints one line per run ("run i/N: <pytest's last line> (exit code)") and a summary; exits with
# the failing run's code, 0 when all N passed. Needs the .venv that scripts/setup.sh makes.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]] || [ "$2" != "--" ]; then
  echo "usage: scripts/repeat.sh N -- <pytest args>" >&2
  exit 2
fi
n="$1"
shift 2
log_dir="$(mktemp -d "${TMPDIR:-/tmp}/hearth-repeat.XXXXXX")"
start=$(date +%s)
for i in $(seq 1 "$n"); do
  log="$log_dir/run-$i.log"
  .venv/bin/python -m pytest "$@" >"$log" 2>&1
  code=$?
  echo "run $i/$n: $(grep -v '^\s*$' "$log" | tail -1) (exit $code)"
  if [ "$code" -ne 0 ]; then
    echo "repeat: run $i failed; its output: $log" >&2
    exit "$code"
  fi
done
echo "repeat: $n/$n runs passed in $(( $(date +%s) - start )) s (logs: $log_dir)"
