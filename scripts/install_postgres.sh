#!/usr/bin/env bash
# Installs Debian's PostgreSQL server for the storage tests (they start a throwaway cluster
# with initdb/pg_ctl in a temporary directory; the system service is never started).
# Needs root (apt-get); elsewhere the PostgreSQL tests skip and say why.
set -u
source "$(dirname "$0")/apt_lock.sh"
for dir in "" /usr/lib/postgresql/*/bin; do
  if [ -z "$dir" ]; then
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && exit 0
  elif [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
    exit 0
  fi
done
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_postgres: not root or no apt-get; the PostgreSQL tests will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d 101: the package must not start the system's PostgreSQL service
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && created_policy=1
fi
apt-get update -qq >/dev/null 9>&- && apt-get install -y -qq postgresql >/dev/null 9>&- \
  || echo "install_postgres: apt-get install postgresql failed; the PostgreSQL tests will skip" >&2
[ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
exit 0
