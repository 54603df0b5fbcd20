#!/usr/bin/env bash
# Fresh machine -> the whole test suite. Installs what the tests need (as root: sshd,
# netcat and iproute2 for the SSH tests; otherwise those tests skip and say why).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  [ -x /usr/sbin/sshd ] || need+=(openssh-server)
  command -v nc >/dev/null || need+=(netcat-openbsd)
  command -v ip >/dev/null || need+=(iproute2)
  # a real 2-node Slurm cluster on loopback for tests/slurm (started by its fixture)
  [ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
  [ -x /usr/sbin/slurmd ] || need+=(slurmd)
  command -v sbatch >/dev/null || need+=(slurm-client)
  [ -x /usr/sbin/munged ] || need+=(munge)
  # headless Chromium for tests/webui (NNI's WebUI in a real browser, driven by playwright)
  [ -x /usr/bin/chromium ] || need+=(chromium chromium-driver)
  # sharedStorage (tests/storage): mount.nfs for the NFS mount path; node + npm for Azurite
  [ -x /sbin/mount.nfs ] || [ -x /usr/sbin/mount.nfs ] || need+=(nfs-common)
  command -v ganesha.nfsd >/dev/null || need+=(nfs-ganesha nfs-ganesha-vfs)   # a real NFS server, in a netns
  command -v npm >/dev/null || need+=(nodejs npm)
  # a real HTTP CONNECT proxy for tests/kube/test_proxy.py (the manager behind a corporate proxy)
  command -v tinyproxy >/dev/null || need+=(tinyproxy)
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  mkdir -p /run/sshd
  # Azurite, Microsoft's Azure Storage emulator, for the AzureBlob shared-storage tests
  if ! command -v azurite-blob >/dev/null && command -v npm >/dev/null; then
    npm install -g --silent --no-fund --no-audit azurite >/dev/null 2>&1 \
      || echo "note: azurite could not be installed; the AzureBlob shared-storage tests will be skipped"
  fi
fi
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1   # playwright drives /usr/bin/chromium; it never downloads one
EXTRAS=test bash scripts/setup_env.sh
# The real NNI SDK, to prove unmodified NNI trial code works; its tests skip without it.
.venv/bin/python -c 'import nni' 2>/dev/null \
  || .venv/bin/python -m pip install -q --disable-pip-version-check 'nni==3.0' hyperopt >>.venv/setup.log 2>&1 \
  || echo "note: the nni package could not be installed; tests marked nni_sdk will be skipped"
# Wheels of the agent's dependencies for this machine's stock Python, fetched while setup may use
# the network: tests/remote/test_shipped_deps.py ships them to a bare worker that reaches no index.
if [ -x /usr/bin/python3 ] && [ ! -f .venv/agent-wheelhouse/.complete ]; then
  .venv/bin/python scripts/fill_wheelhouse.py .venv/agent-wheelhouse \
      --python "$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" >>.venv/setup.log 2>&1 \
    && touch .venv/agent-wheelhouse/.complete \
    || echo "note: the agent wheelhouse could not be filled; tests/remote/test_shipped_deps.py will be skipped"
fi
# A worker Python's own old protobuf (NNI's default image has 3.19; pure Python, any Python 3), fetched
# while setup may use the network: the trial-isolation tests give it to a worker and its trials.
if [ ! -d .venv/old-protobuf/google/protobuf ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --target .venv/old-protobuf 'protobuf==3.19.6' >>.venv/setup.log 2>&1 \
    || echo "note: protobuf 3.19.6 could not be fetched; the trial-isolation tests will be skipped"
fi
# NNI's default image (msranni/nni:latest: CPython 3.8 with nni==3.0) and the agent's wheels for it, made
# while setup may use the network: the default-image tests of AML, OpenPAI and Kubernetes run trials in it.
.venv/bin/python -m tests.support.nni_image >>.venv/setup.log 2>&1 \
  || echo "note: the msranni/nni:latest environment could not be made (see .venv/setup.log); its tests make it or skip saying why"
.venv/bin/python scripts/gen_proto.py --check
# Lint and type-check before the tests (config in pyproject.toml); any finding fails the run.
.venv/bin/ruff check manager agent tests scripts
.venv/bin/mypy
export PATH="$PWD/.venv/bin:$PATH"   # trials run `python ...` with the venv's Python, as for users
# Byte-code for the project's own modules and the tests, made once: where PYTHONDONTWRITEBYTECODE is set
# (this machine sets it), no process writes any, and every manager, agent, emulator and pytest worker
# compiled the same sources again (about 0.2 CPU s per manager start; pytest's assertion rewriting of
# every test module, 5 CPU s per worker). Python still reads byte-code with the variable set.
python -m compileall -q -j 0 agent manager tests scripts >/dev/null
env -u PYTHONDONTWRITEBYTECODE python -m pytest -q -p no:cacheprovider --collect-only tests >/dev/null 2>&1 || true
# The 25 slowest tests, then the suite's own wall time (docs/testing.md: the layers and their times).
# Most tests wait on processes, sleeps and sockets, so more workers than cores pay off: three per core by
# default, at most 8 (each runs its own emulators; on 2 cores: 4 workers 983 s, 6 workers 877 s, 8 workers
# 906 s, docs/testing.md); NNI_TEST_WORKERS overrides the count (0: one process, no xdist). The Slurm tests
# and the two that log in as root share one worker (tests/support/parallel.py).
default_workers=$((3 * $(nproc)))
[ "$default_workers" -le 8 ] || default_workers=8
workers=${NNI_TEST_WORKERS:-$default_workers}
started=$SECONDS
rc=0
# A short base for tmp_path: a hub socket under it must stay within the 107-byte Unix limit.
basetemp=$(mktemp -d /tmp/nt.XXXXXX)
python -m pytest -q -p no:cacheprovider --durations=25 --basetemp "$basetemp" -n "$workers" --dist loadgroup "$@" || rc=$?
rm -rf "$basetemp"
echo "scripts/test.sh: pytest ran $((SECONDS - started)) s (exit $rc)"
exit "$rc"
