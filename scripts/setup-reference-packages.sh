#!/usr/bin/env bash
# The authors' scoring packages the equality tests of tests/evaluate/test_preference.py run against, installed
# without their dependencies: hpsv2 1.2.0 pins protobuf<4 and pytest 7.2.0, image-reward 1.5 timm 0.6.13,
# each of which would change this stack's pins; the code paths the tests call need none of them. Not part
# of the workbench: its scorers are evaluate/pickscore.py, hps.py, imagereward.py and aesthetic.py.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -c 'import hpsv2, fairscale, clint' 2>/dev/null \
  && .venv/bin/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("ImageReward") is None)' && exit 0
echo "== installing the preference scorers' reference packages (hpsv2, image-reward) for the tests"
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -m uv pip install --quiet --python .venv/bin/python --no-deps hpsv2==1.2.0 image-reward==1.5 \
  fairscale==0.4.13 clint==0.5.1
