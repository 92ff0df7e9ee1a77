#!/usr/bin/env bash
# Installs Debian's Chromium for the end-to-end browser test.
# Needs root (apt-get); elsewhere the browser test skips and says why.
set -u
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_browser: not root or no apt-get; the browser test will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null \
  || echo "install_browser: apt-get install chromium failed; the browser test will skip" >&2
exit 0
