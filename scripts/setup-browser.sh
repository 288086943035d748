#!/usr/bin/env bash
# Debian's chromium for the browser tests (driven by Playwright's Python package with executable_path).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing Debian's chromium for the browser tests"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  echo "== installing Debian's chromium for the browser tests (sudo)"
  sudo apt-get update -qq >/dev/null
  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
else
  echo "warning: chromium is not installed and cannot be installed here; browser tests will be skipped" >&2
fi
