#!/usr/bin/env bash
# Installs Debian's Slurm (slurmctld, slurmd, the client commands) and munge for the Slurm
# tests (tests/support/slurm.py starts a throwaway one-node controller, node and munge daemon
# in a temporary directory, on free ports; the system services are never started).
# Needs root (apt-get); elsewhere the Slurm tests skip and say why.
set -u
source "$(dirname "$0")/apt_lock.sh"
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
if have slurmctld && have slurmd && have sbatch && have munged; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_slurm: not root or no apt-get; the Slurm tests will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d 101: the packages must not start the system's slurmctld, slurmd or munge services
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && created_policy=1
fi
apt-get update -qq >/dev/null 9>&- && apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null 9>&- \
  || echo "install_slurm: apt-get install slurmctld slurmd slurm-client munge failed; the Slurm tests will skip" >&2
[ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
exit 0
