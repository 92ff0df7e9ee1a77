#!/usr/bin/env bash
# Installs Debian's Chromium for the browser tests.
# Needs root (apt-get); elsewhere the browser tests skip and say why.
# --background: install in a process of its own and return at once (`make test` does, so the
# download overlaps the checks and the first tests); run without it, the script waits for
# that install to finish (scripts/apt_lock.sh), as the browser tests do before they start.
set -u
installed() { command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; }
if [ "${1:-}" = "--background" ]; then
  installed && exit 0
  nohup bash "$0" > "${TMPDIR:-/tmp}/basis-lab-install-browser.log" 2>&1 < /dev/null &
  exit 0
fi
source "$(dirname "$0")/apt_lock.sh"
installed && exit 0
apt_install install_browser "the browser tests will skip" chromium
exit 0
