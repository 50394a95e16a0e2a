#!/usr/bin/env bash
# Start a real single-node SLURM cluster on this Debian machine (as root, no systemd): munged,
# slurmctld and slurmd run in the background and their PIDs are recorded under $SLURM_DIR, so that
# stop.sh stops exactly what this script started. Idempotent: if a SLURM controller already
# answers, nothing is started and nothing is recorded. Takes ~6 s once the packages are installed.
#
#   sudo scripts/slurm/start.sh            # then: sinfo; srun hostname
#   SLURM_DIR=/tmp/myslurm scripts/slurm/start.sh
#
# Dask workers submitted through dask-jobqueue need one core each: ask for at most `nproc` one-core
# jobs, and bind the Dask scheduler to 127.0.0.1 to keep the traffic on loopback.
set -euo pipefail
SLURM_DIR=${SLURM_DIR:-${TMPDIR:-/tmp}/coffea-sonic-slurm}
say() { printf '[slurm/start] %s\n' "$*"; }

if command -v scontrol >/dev/null 2>&1 && timeout 5 scontrol ping 2>/dev/null | grep -q UP; then
  say "a SLURM controller is already up; nothing started"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  say "must run as root (it installs packages and starts the SLURM and munge daemons)" >&2
  exit 3
fi

# 1. packages (only when missing; wait for another apt run instead of failing on its lock)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || { say "slurm-wlm/munge are not installed and there is no apt-get" >&2; exit 4; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  say "installed slurm $(dpkg-query -W -f='${Version}' slurmctld), munge $(dpkg-query -W -f='${Version}' munge)"
fi
mkdir -p "$SLURM_DIR"/{state,spool,log}

# 2. munge (the Debian postinst generates the key; make one if it is missing)
if [ ! -s /etc/munge/munge.key ]; then
  mungekey -c -k /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then   # a systemd host may already run it
  runuser -u munge -- /usr/sbin/munged                        # daemonizes, writes /run/munge/munged.pid
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null
  cp /run/munge/munged.pid "$SLURM_DIR/munged.pid"
fi

# 3. slurm.conf: this host as controller and the only node, all its cores, 85 % of its memory
HOST=$(hostname -s)
getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >> /etc/hosts
# nproc honours OMP_NUM_THREADS (test runners set it to 1): count the cores themselves
NCPU=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
MEM_MB=$(( $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) * 85 / 100 ))
mkdir -p /etc/slurm
cat > /etc/slurm/slurm.conf <<CONF
# written by coffea-sonic scripts/slurm/start.sh
ClusterName=coffeasonic
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MailProg=/bin/true
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pidfile
SlurmdPidFile=$SLURM_DIR/slurmd.pidfile
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
KillWait=5
NodeName=$HOST CPUs=$NCPU RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

# 4. daemons in foreground mode, backgrounded, PIDs recorded (-i: ignore stale state)
/usr/sbin/slurmctld -D -i >"$SLURM_DIR/log/slurmctld.out" 2>&1 &
echo $! >"$SLURM_DIR/slurmctld.pid"
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
/usr/sbin/slurmd -D >"$SLURM_DIR/log/slurmd.out" 2>&1 &
echo $! >"$SLURM_DIR/slurmd.pid"
for _ in $(seq 150); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break; sleep 0.2; done
if [ "$(sinfo -h -o %t 2>/dev/null)" != idle ]; then
  say "the node did not become idle; logs in $SLURM_DIR/log:" >&2
  tail -n 20 "$SLURM_DIR"/log/*.log >&2 || true
  exit 5
fi
timeout 60 srun -N1 -n1 true
say "SLURM up: partition debug, node $HOST, $NCPU CPUs, ${MEM_MB} MB (state in $SLURM_DIR)"
