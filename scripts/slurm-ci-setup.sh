#!/usr/bin/env bash
# Starts a real single-host Slurm cluster (munged, slurmctld, slurmd from Debian's packages)
# on this machine, for the `--launcher slurm` integration tests (tests/slurm_real.rs).
#
# Run as root on a Debian (bookworm) machine, e.g. a fresh CI runner:
#     scripts/slurm-ci-setup.sh && export BENCH_SLURM_TESTS=1
# It is idempotent: a second run with the cluster already up returns in about a second, and
# a run after a reboot or a config change restarts only what is needed. It never uses systemd
# (CI containers have none); the daemons are started directly and daemonize themselves.
#
# Settings (environment):
#   BENCH_SLURM_CONF_DIR  where slurm.conf goes (default /etc/slurm, where the tools look)
#   BENCH_SLURM_WAIT_S    how long to wait for the node to become idle (default 60)
set -euo pipefail

log() { echo "slurm-ci-setup: $*" >&2; }
die() {
  log "FAILED: $*"
  for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log /var/log/munge/munged.log; do
    if [ -f "$f" ]; then
      log "--- last lines of $f ---"
      tail -n 20 "$f" >&2 || true
    fi
  done
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts daemons)"

CONF_DIR="${BENCH_SLURM_CONF_DIR:-/etc/slurm}"
WAIT_S="${BENCH_SLURM_WAIT_S:-60}"
HOST="$(hostname -s)"
NCPU="$(nproc)"

# 1. Packages. Only installed when a binary is missing, so a second run skips apt entirely.
need_install=0
for bin in slurmctld slurmd sbatch squeue scontrol munged; do
  if ! command -v "$bin" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$bin" ]; then
    need_install=1
  fi
done
if [ "$need_install" -eq 1 ]; then
  log "installing slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be stale or absent on a fresh machine; update once, then install.
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
    || die "apt-get install slurmctld slurmd slurm-client munge failed"
fi
export PATH="/usr/sbin:/sbin:$PATH"

# 2. Munge: a key (the package's postinst usually creates one) and a running munged.
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  log "creating munge key"
  if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --force --keyfile /etc/munge/munge.key
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
fi
if id munge >/dev/null 2>&1; then
  chown munge:munge /etc/munge /etc/munge/munge.key /var/lib/munge /var/log/munge /run/munge
fi
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  rm -f /run/munge/munge.socket.2.lock
  if id munge >/dev/null 2>&1; then
    runuser -u munge -- munged || die "munged did not start"
  else
    munged --force || die "munged did not start"
  fi
  for _ in $(seq 1 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n | unmunge >/dev/null || die "munge credentials do not round-trip"
fi

# 3. slurm.conf for one host that is both controller and compute node. The daemons run as
# root so that spool directories need no ownership dance; proctrack/linuxproc and task/none
# avoid cgroups, which containers often lack; no accounting daemon (sacct is not needed:
# bench reads job states from squeue and scontrol).
mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
# Memory the node offers: small and fixed so that the config never exceeds the machine.
MEM_MB=1024
conf="$(cat <<EOF
# Written by bench's scripts/slurm-ci-setup.sh: a single-host cluster for CI.
ClusterName=benchci
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=600
KillWait=5
InactiveLimit=0
Waittime=0
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${NCPU} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Default=YES Nodes=ALL MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
)"
changed=0
if [ ! -f "$CONF_DIR/slurm.conf" ] || [ "$(cat "$CONF_DIR/slurm.conf")" != "$conf" ]; then
  printf '%s\n' "$conf" >"$CONF_DIR/slurm.conf"
  changed=1
fi
export SLURM_CONF="$CONF_DIR/slurm.conf"

# A daemon counts as running when the pid in its pid file is alive.
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {
  if alive "$1"; then
    kill "$(cat "$1")" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$1" || break; sleep 0.1; done
  fi
}

if [ "$changed" -eq 1 ]; then
  log "slurm.conf written to $CONF_DIR/slurm.conf; (re)starting daemons"
  stop /run/slurm/slurmd.pid
  stop /run/slurm/slurmctld.pid
fi

# 4. Daemons. slurmctld first (slurmd registers with it); both daemonize by default.
if ! alive /run/slurm/slurmctld.pid; then
  log "starting slurmctld"
  # -i ignores state saved by an earlier run with another config.
  slurmctld -f "$SLURM_CONF" -i || die "slurmctld did not start"
fi
for _ in $(seq 1 100); do
  scontrol ping 2>/dev/null | grep -q "UP" && break
  sleep 0.2
done
scontrol ping 2>/dev/null | grep -q "UP" || die "slurmctld does not answer scontrol ping"
if ! alive /run/slurm/slurmd.pid; then
  log "starting slurmd"
  slurmd -f "$SLURM_CONF" -N "$HOST" || die "slurmd did not start"
fi

# 5. Wait until the node is idle (or mixed/allocated by a job of a previous run).
deadline=$((SECONDS + WAIT_S))
resumed=0
while :; do
  state="$(sinfo -h -n "$HOST" -o '%t' 2>/dev/null | head -n1 || true)"
  case "$state" in
    idle | mix | alloc | comp)
      break
      ;;
    down* | drain* | drng* | fail*)
      if [ "$resumed" -eq 0 ]; then
        log "node state '$state'; resuming it"
        scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
        resumed=1
      fi
      ;;
  esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    sinfo -N -l >&2 || true
    scontrol show node "$HOST" >&2 || true
    die "node $HOST not idle after ${WAIT_S}s (last state: '${state:-none}')"
  fi
  sleep 0.5
done
log "ready: node $HOST ($NCPU CPUs) in partition debug, state $state; SLURM_CONF=$SLURM_CONF"
