#!/usr/bin/env bash
# A real network filesystem on one machine, for the scale benchmark (benchmarks/bench_sidecars.py):
# sshfs (FUSE, SFTP) against an sshd bound to 127.0.0.1 inside a loopback-only network namespace
# (scripts/loopback.sh). This kernel has nfsd but no NFS client, so NFS itself cannot be mounted
# here; sshfs caches as an NFS client does, by timeouts (docs/slurm.md says what it reproduces).
#
#   bash scripts/netfs.sh up DIR [SECONDS]   # serve DIR/export, mount it at DIR/mnt; SECONDS
#                                            #   (default 3): attributes, names and absent names
#                                            #   cached that long (NFS's actimeo, lookupcache=all);
#                                            #   what NFS revalidates at open (close-to-open: a
#                                            #   file's data, a folder's listing) read anew
#   bash scripts/netfs.sh client DIR         # one more client at DIR/mnt, in the caller's mount
#                                            #   namespace (a node of its own: unshare --mount)
#   bash scripts/netfs.sh down DIR
#
# Needs root (the namespace, FUSE), and Debian's openssh-server and sshfs:
#   apt-get install openssh-server sshfs
# Nothing listens beyond loopback: sshd's only address is 127.0.0.1, in a namespace with no other
# interface; the mount is made from that namespace and seen from everywhere on this machine.
set -euo pipefail
command="${1:?usage: netfs.sh up|down DIR [SECONDS]}"
dir="$(realpath -m "${2:?usage: netfs.sh up|down DIR [SECONDS]}")"
seconds="${3:-3}"
port=2222
ns="areal-netfs-$(echo -n "$dir" | md5sum | cut -c1-8)"
here="$(cd "$(dirname "$0")" && pwd)"

down() {
  fusermount3 -u "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
  if [ -s "$dir/sshd.pid" ]; then kill "$(cat "$dir/sshd.pid")" 2>/dev/null || true; fi
  ip netns delete "$ns" 2>/dev/null || true
}

up() {
  for tool in sshd:/usr/sbin/sshd sshfs:sshfs; do
    if ! command -v "${tool#*:}" >/dev/null; then
      echo "netfs.sh: ${tool%%:*} is missing: apt-get install openssh-server sshfs" >&2
      exit 2
    fi
  done
  mkdir -p "$dir/export" "$dir/mnt" /run/sshd
  chmod 700 "$dir"
  [ -f "$dir/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
  [ -f "$dir/client_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/client_key"
  cp "$dir/client_key.pub" "$dir/authorized_keys"
  cat >"$dir/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
MaxStartups 1100
MaxSessions 1100
EOF
  ip netns list | grep -qw "$ns" || bash "$here/loopback.sh" --create "$ns"
  nsenter --net="/var/run/netns/$ns" /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log"
  echo "$seconds" >"$dir/seconds"
  client
  echo "netfs: $dir/mnt (sshfs over 127.0.0.1:$port in netns $ns, caches ${seconds} s)"
}

client() {
  local t
  t="$(cat "$dir/seconds")"
  nsenter --net="/var/run/netns/$ns" sshfs "root@127.0.0.1:$dir/export" "$dir/mnt" -o \
"port=$port,IdentityFile=$dir/client_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,\
LogLevel=ERROR,attr_timeout=$t,entry_timeout=$t,negative_timeout=$t,dcache_timeout=$t,\
dcache_dir_timeout=0,direct_io,allow_other"
}

case "$command" in
  up) down; up ;;
  client) client ;;
  down) down ;;
  *) echo "netfs.sh: unknown command $command (up, client or down)" >&2; exit 2 ;;
esac
