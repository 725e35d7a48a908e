#!/usr/bin/env bash
# Network namespaces with only the loopback interface, for AReaL's tests and demo: nothing inside
# can reach or be reached from another machine, and AReaL's gethostip() (which skips 127.* and
# asks the route to 8.8.8.8) answers 127.0.0.1, so every address AReaL binds or advertises is a
# loopback one. Needs root (CAP_SYS_ADMIN).
#
#   bash scripts/loopback.sh COMMAND [ARGS...]   # run COMMAND in a namespace of its own
#   bash scripts/loopback.sh --create NAME       # a named one, for daemons (a test Slurm
#                                                #   cluster); enter it with
#                                                #   nsenter --net=/var/run/netns/NAME COMMAND
#   bash scripts/loopback.sh --delete NAME
#
# Besides 127.0.0.1, lo carries 10.255.0.1/32: Slurm resolves names with AI_ADDRCONFIG, which
# finds nothing on a host that has only 127.* addresses. It is still the loopback interface.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "loopback.sh: needs root to create a network namespace" >&2
  exit 2
fi
SETUP='ip link set lo up && ip addr add 10.255.0.1/32 dev lo && ip route add default dev lo src 127.0.0.1'
case "${1:-}" in
  --create)
    ip netns add "${2:?name}"
    ip netns exec "$2" sh -c "$SETUP"
    ;;
  --delete)
    ip netns delete "${2:?name}"
    ;;
  *)
    exec unshare --net -- bash -c "$SETUP"' && exec "$@"' loopback "$@"
    ;;
esac
