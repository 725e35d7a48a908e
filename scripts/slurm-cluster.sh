#!/usr/bin/env bash
# A real Slurm cluster of four nodes on this one machine, from Debian's slurm-wlm and munge
# packages: one controller and four slurmd daemons ("node1" ... "node4") on loopback ports.
#
#   bash scripts/slurm-cluster.sh install  # install Debian's slurm-wlm and munge (root) if missing
#   bash scripts/slurm-cluster.sh up       # install if needed (root), start, wait until idle
#   bash scripts/slurm-cluster.sh status
#   bash scripts/slurm-cluster.sh down     # stop the daemons it started, remove its state
#   bash scripts/slurm-cluster.sh munge    # only munged (for clusters side by side; `down` ends it)
#
# Clients find the cluster through SLURM_CONF: `up` prints the line to export. State lives in
# $AREAL_SLURM_DIR (default /tmp/areal-slurm). Nothing listens beyond 127.0.0.1's ports
# 16817 (controller) and 17001-17004 (the nodes). AREAL_SLURM_NODES=N makes N nodes instead;
# AREAL_SLURM_FIRST_JOB_ID=N numbers its jobs from N (clusters side by side never share a job id,
# which names a job's processes in their environment).
set -euo pipefail
DIR="${AREAL_SLURM_DIR:-/tmp/areal-slurm}"
CONF="$DIR/slurm.conf"
CPUS="$(nproc)"
NODES="${AREAL_SLURM_NODES:-4}"
FIRST_JOB_ID="${AREAL_SLURM_FIRST_JOB_ID:-1}"
MEM_MB="$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 4 ))"

log() { echo "[slurm-cluster] $*" >&2; }

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    return 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "slurmctld/slurmd/munged are missing; install Debian's slurm-wlm and munge as root"
    return 1
  fi
  log "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  cat > "$CONF" <<EOF
ClusterName=areal
SlurmctldHost=localhost
SlurmctldAddr=127.0.0.1
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmdTimeout=30
MpiDefault=none
FirstJobId=$FIRST_JOB_ID
$(for i in $(seq 1 "$NODES"); do
  echo "NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
done)
PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
}

start_munge() {
  if pgrep -x munged >/dev/null; then
    return 0
  fi
  if [ ! -f /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then mungekey -c; else
      dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  munged --force
  echo started > "$DIR/munged.ours"
  for _ in $(seq 1 50); do  # a slurmd that starts before munged answers registers a minute late
    munge -n </dev/null >/dev/null 2>&1 && break
    sleep 0.2
  done
}

up() {
  install_packages
  mkdir -p "$DIR"
  write_conf
  start_munge
  if ! pgrep -f "slurmctld -f $CONF" >/dev/null; then
    rm -rf "$DIR/state" "$DIR/spool"  # a fresh controller: no jobs from an earlier life
    mkdir -p "$DIR/state" "$DIR/spool"
    slurmctld -f "$CONF"
  fi
  for node in $(seq -f "node%g" 1 "$NODES"); do
    if ! pgrep -f "slurmd -f $CONF -N $node" >/dev/null; then
      AREAL_TEST_CLUSTER="$DIR" slurmd -f "$CONF" -N "$node"  # its slurmstepds inherit the mark
    fi
  done
  export SLURM_CONF="$CONF"
  for _ in $(seq 1 60); do
    if [ "$(sinfo -h -o '%T' 2>/dev/null | sort -u | tr -d '\n')" = "idle" ]; then
      log "cluster up: $(sinfo -h -o '%N %T' | tr '\n' ' ')"
      echo "export SLURM_CONF=$CONF"
      return 0
    fi
    sleep 1
  done
  log "nodes did not become idle within 60 s:"
  sinfo >&2 || true
  return 1
}

down() {
  if [ -f "$CONF" ]; then
    SLURM_CONF="$CONF" scancel --user="$(id -un)" >/dev/null 2>&1 || true
  fi
  for pidfile in "$DIR"/slurmd-node*.pid "$DIR"/slurmctld.pid; do
    if [ -f "$pidfile" ]; then
      kill "$(cat "$pidfile")" 2>/dev/null || true
    fi
  done
  for _ in $(seq 1 20); do
    pgrep -f "slurm(ctld|d) -f $CONF" >/dev/null || break
    sleep 0.5
  done
  pkill -9 -f "slurm(ctld|d) -f $CONF" 2>/dev/null || true
  # A step daemon whose slurmd went first (or that hung) outlives it: ours carry the mark.
  for pid in $(pgrep -f '^slurmstepd' || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "AREAL_TEST_CLUSTER=$DIR"; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  if [ -f "$DIR/munged.ours" ] && [ -f /run/munge/munged.pid ]; then
    munged_pid="$(cat /run/munge/munged.pid)"
    kill "$munged_pid" 2>/dev/null || true
    for _ in $(seq 1 50); do  # gone before an `up` right after looks for it
      kill -0 "$munged_pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -rf "$DIR"
  log "cluster down"
}

case "${1:-}" in
  install) install_packages ;;
  up) up ;;
  munge) mkdir -p "$DIR"; start_munge ;;
  down) down ;;
  status) SLURM_CONF="$CONF" sinfo && SLURM_CONF="$CONF" squeue ;;
  *) echo "usage: $0 install|up|munge|down|status" >&2; exit 2 ;;
esac
