#!/usr/bin/env bash
# Create .venv with the pinned stack (requirements.lock) and install the workbench into it.
# Re-running is cheap: uv reuses its download cache (~/.cache/uv) and skips what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || { echo "error: Python 3.11 is required (found $("$PYTHON" --version 2>&1))" >&2; exit 1; }

if ! "$PYTHON" -m uv --version >/dev/null 2>&1; then
  echo "== installing uv"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check uv
fi
UV=("$PYTHON" -m uv)

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "${UV[@]}" venv --quiet --python "$PYTHON" .venv
fi
echo "== installing the pinned stack (requirements.lock)"
"${UV[@]}" pip install --quiet --compile-bytecode --python .venv/bin/python -r requirements.lock
"${UV[@]}" pip install --quiet --python .venv/bin/python --no-deps -e .
# img2dataset's writer classes build the conversion tests' shards; why without its dependencies: the file says
"${UV[@]}" pip install --quiet --python .venv/bin/python --no-deps -r requirements-nodeps.txt
# Bytecode for every installed module, once: without it each `dwb` start recompiles torch, composer
# and diffusers from source (about 15 s on 2 cores, e.g. where PYTHONDONTWRITEBYTECODE is set).
if [ ! -f .venv/.bytecode-stamp ] || [ requirements.lock -nt .venv/.bytecode-stamp ]; then
  echo "== compiling bytecode"
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python3.11/site-packages >/dev/null 2>&1 || true
  touch .venv/.bytecode-stamp
fi
echo "== ready: $(.venv/bin/python -c 'import torch, composer, diffusers; print(f"torch {torch.__version__}, composer {composer.__version__}, diffusers {diffusers.__version__}")')"
