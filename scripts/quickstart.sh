#!/usr/bin/env bash
# Fresh machine -> a real NNI experiment on this machine (examples/quickstart), with NNI's WebUI.
set -euo pipefail
cd "$(dirname "$0")/.."
# the example trains scikit-learn models (test extra); NNI's WebUI comes from the nni package (webui extra)
EXTRAS=test,webui bash scripts/setup_env.sh
export PATH="$PWD/.venv/bin:$PATH"      # trials run `python train.py` with the venv's Python
# The WebUI's URL is printed at the start. In a terminal the WebUI stays up after the summary
# until Ctrl-C, as NNI's does; without one (CI, a pipe) the run ends with the summary.
exec nni-manager run examples/quickstart/config.yml "$@"
