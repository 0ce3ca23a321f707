#!/usr/bin/env bash
# A single-node SLURM on this machine for the tests: `.ci/slurm.sh start` installs Debian's slurmctld,
# slurmd and munge if missing, writes a config with four dummy GPUs (gres backed by empty device files)
# and starts the daemons; `.ci/slurm.sh stop` stops them. Needs root.
set -euo pipefail
state=/tmp/grpo-slurm
case "${1:-}" in
start)
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
  fi
  mkdir -p "$state"/{spool,ctld,log} /etc/slurm /run/munge /var/log/munge /var/lib/munge
  for i in 0 1 2 3; do : > "$state/fakegpu$i"; done
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge && dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
  chmod 400 /etc/munge/munge.key
  pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
  host=$(hostname -s)
  mem=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) - 2048 ))
  cat > /etc/slurm/slurm.conf <<CONF
ClusterName=grpo
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
MinJobAge=600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
NodeName=${host} NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=${mem} Gres=gpu:4 State=UNKNOWN
PartitionName=main Nodes=${host} Default=YES MaxTime=INFINITE State=UP
CONF
  echo "Name=gpu File=$state/fakegpu[0-3]" > /etc/slurm/gres.conf
  pgrep -x slurmctld >/dev/null || slurmctld
  pgrep -x slurmd >/dev/null || slurmd
  for _ in $(seq 30); do
    if sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed|allocated"; then sinfo; exit 0; fi
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "SLURM did not come up; see $state/log" >&2
  exit 1
  ;;
stop)
  for daemon in slurmd slurmctld munged; do pkill -x "$daemon" || true; done
  # slurmctld saves its state before it exits: a start right after a stop must not find it still running
  for _ in $(seq 50); do
    pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || pgrep -x munged >/dev/null || break
    sleep 0.2
  done
  # With its configuration left behind, every SLURM client (and every Snakemake start: the SLURM executor plugin runs
  # `scontrol show config` when it is imported) waits 9 s for the controller that is gone; without it they fail at
  # once. `start` writes it again.
  rm -f /etc/slurm/slurm.conf
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
