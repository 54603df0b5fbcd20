#!/usr/bin/env bash
# Fresh machine -> a real NNI experiment on this machine (examples/quickstart).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash scripts/setup_env.sh   # the example trains scikit-learn models
export PATH="$PWD/.venv/bin:$PATH"      # trials run `python train.py` with the venv's Python
# the WebUI is up while it runs (its URL is printed); it ends with the summary (--keep-serving: stay up)
exec nni-manager run examples/quickstart/config.yml --no-keep-serving "$@"
