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
apt_install install_slurm "the Slurm tests will skip" --no-install-recommends slurmctld slurmd slurm-client munge
exit 0
