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
apt_install install_postgres "the PostgreSQL tests will skip" postgresql
exit 0
