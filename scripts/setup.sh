#!/usr/bin/env bash
# Everything a fresh machine needs: the package with its dev and lab extras, and Debian's
# chromium (kaleido's static export and the Playwright browser test drive it).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[dev,lab]"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq chromium >/dev/null \
    || echo "setup: could not install chromium; PNG/SVG export and the browser test will be skipped"
fi
# With a CUDA GPU, add the gpu extra: python -m pip install -e '.[gpu]'
