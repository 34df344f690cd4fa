#!/usr/bin/env bash
# The GPU kit: scripts/gpu_check.sh OUT_DIR [--device auto|cuda|cpu] [--quick] [--only NAME,...] [--budget S]
# Runs scripts/gpu_check.py from this working tree (teachkit need not be installed: src/ goes on PYTHONPATH when
# teachkit does not import) with .venv/bin/python when there is one, else python3. See docs/gpu.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
if ! "$python" -c "import teachkit" >/dev/null 2>&1; then
    export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$python" scripts/gpu_check.py "$@"
