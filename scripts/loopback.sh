#!/usr/bin/env bash
# Run a command in a network namespace of its own that has only the loopback interface, with a
# default route through it: nothing inside can reach or be reached from another machine, and
# AReaL's gethostip() (which skips 127.* and asks the route to 8.8.8.8) answers 127.0.0.1, so
# every address AReaL binds or advertises is a loopback one. Needs root (CAP_SYS_ADMIN).
#
#   bash scripts/loopback.sh COMMAND [ARGS...]
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "loopback.sh: needs root to create a network namespace (unshare -n)" >&2
  exit 2
fi
exec unshare --net -- bash -c \
  'ip link set lo up && ip route add default dev lo src 127.0.0.1 && exec "$@"' loopback "$@"
