#!/usr/bin/env bash
# Create .venv with nni-agent (agent + manager extra) installed from this checkout.
# Sourced by scripts/quickstart.sh and scripts/test.sh; safe to run again (fast when done).
# pip's chatter goes to .venv/setup.log and is shown only if something fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setting up .venv (first run: a minute or two) ..."
  "$PYTHON" -m venv .venv
fi
if ! { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip \
       && .venv/bin/python -m pip install --disable-pip-version-check -e ".[manager${EXTRAS:+,$EXTRAS}]"; } \
     > .venv/setup.log 2>&1; then
  cat .venv/setup.log >&2
  echo "setup failed: see the pip output above (also in .venv/setup.log)" >&2
  exit 1
fi
