# Sourced by the install scripts: holds this project's apt-get lock until the sourcing script
# exits. apt-get fails beside another apt-get; with the lock, `make test`'s background Chromium
# install, PostgreSQL's install and a browser test's check queue instead, each waiting for
# the one before it to finish. The scripts run apt-get with the lock's descriptor closed
# (9>&-), so no service a package starts can hold the lock after the script ends.
exec 9>"${TMPDIR:-/tmp}/basis-lab-apt.lock"
flock 9 || true

# apt_install NAME SKIPS [FLAGS…] PACKAGE…: as root, Debian's PACKAGEs installed quietly with no
# service of theirs started (policy-rc.d answering 101 while apt-get runs); elsewhere, or where
# apt-get fails, one line from NAME ending in SKIPS (which tests will skip). Returns 0 always:
# a machine without the packages runs the suite with those tests skipped.
apt_install() {
  local name=$1 skips=$2 created_policy=0
  shift 2
  local packages=("${@/#-*/}")
  if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$name: not root or no apt-get; $skips" >&2
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && created_policy=1
  fi
  apt-get update -qq >/dev/null 9>&- && apt-get install -y -qq "$@" >/dev/null 9>&- \
    || echo "$name: apt-get install $(echo ${packages[*]}) failed; $skips" >&2
  if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  return 0
}
