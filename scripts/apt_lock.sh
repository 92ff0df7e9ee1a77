# Sourced by the install scripts: holds this project's apt-get lock until the sourcing script
# exits. apt-get fails beside another apt-get; with the lock, `make test`'s background Chromium
# install, PostgreSQL's install and a browser test's check queue instead, each waiting for
# the one before it to finish. The scripts run apt-get with the lock's descriptor closed
# (9>&-), so no service a package starts can hold the lock after the script ends.
exec 9>"${TMPDIR:-/tmp}/basis-lab-apt.lock"
flock 9 || true
