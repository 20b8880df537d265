#!/usr/bin/env bash
# Create benchmarks/.peers-venv and install the peer job queues into it.
# Idempotent: a venv whose packages all import is left alone.
# Usage: bash benchmarks/setup_peers.sh [--force]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.peers-venv"
py="${PYTHON:-python3}"

peers=(rq "celery[redis]" "dramatiq[redis]" huey saq arq bullmq redis hiredis)
# import names checked to decide whether the venv is complete
imports="rq celery dramatiq huey saq arq bullmq redis"

check() {
    "$venv/bin/python" - "$imports" <<'EOF' >/dev/null 2>&1
import importlib, sys
for name in sys.argv[1].split():
    importlib.import_module(name)
EOF
}

if [[ "${1:-}" != "--force" && -x "$venv/bin/python" ]] && check; then
    echo "peers venv ready: $venv"
    exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
    "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "${peers[@]}"
check || { echo "peers venv: some peers do not import" >&2; exit 1; }

# record what got installed
"$venv/bin/python" -m pip freeze > "$venv/installed.txt"
echo "peers venv ready: $venv"
grep -iE '^(rq|celery|dramatiq|huey|saq|arq|bullmq|redis|hiredis)==' "$venv/installed.txt" || true
