#!/usr/bin/env bash
# Debian packages the tests use: chromium (browser tests, driven by Playwright's Python package with
# executable_path), postgresql (human_eval's multi-instance store; the tests start a private cluster) and strace
# (tests/app/test_links_out.py records every file the app opens, the Rust readers' too).
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v strace >/dev/null 2>&1 || missing+=(strace)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
    echo "warning: ${missing[*]} not installed and no root to install them; those tests will be skipped" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "warning: ${missing[*]} not installed (no apt-get here); those tests will be skipped" >&2
  exit 0
fi
echo "== installing Debian packages for the tests: ${missing[*]}"
"${SUDO[@]}" apt-get update -qq >/dev/null
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
