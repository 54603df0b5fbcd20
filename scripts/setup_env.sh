#!/usr/bin/env bash
# Create .venv with nni-agent (agent + manager extra) installed from this checkout.
# Sourced by scripts/quickstart.sh and scripts/test.sh; safe to run again (fast when done).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[manager${EXTRAS:+,$EXTRAS}]"
