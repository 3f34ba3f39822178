#!/usr/bin/env bash
# Create .venv (if missing) and install mgeo-index with its test dependencies from this checkout.
# torch is pinned to the CPU wheel (2.13.0) first so that nothing pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
echo "installed: $(.venv/bin/mgeo-index --help >/dev/null && echo mgeo-index) into .venv"
