#!/usr/bin/env bash
# Starts a real Slurm cluster (munged, slurmctld and three slurmd from Debian's packages) on
# this machine, for the `--launcher slurm` integration tests (tests/slurm_*.rs):
#   - node `$(hostname -s)` (the host itself, at 127.0.0.1) in partition `debug`, the default;
#   - nodes `node1` and `node2` in partition `multi`, each a slurmd of its own in a network
#     namespace (`bench-node1`, `bench-node2`) with its own UTS hostname and its own address
#     on a bridge (`benchbr0`, 10.77.0.0/24 by default; the host is .1, nodeN is .1N), so
#     that a job over both nodes rendezvouses across two hosts as far as its ranks can tell.
#     The namespaces share the host's file system (munged's socket, the spool and results
#     folders, the Python the ranks run) as compute nodes share a cluster's file system.
#
# Run as root on a Debian (bookworm) machine, e.g. a fresh CI runner:
#     scripts/slurm-ci-setup.sh && export BENCH_SLURM_TESTS=1
# It is idempotent: a second run with the cluster already up returns in about a second, and
# a run after a reboot or a config change restarts only what is needed. It never uses systemd
# (CI containers have none); the daemons are started directly and daemonize themselves.
#
# Settings (environment):
#   BENCH_SLURM_CONF_DIR  where slurm.conf goes (default /etc/slurm, where the tools look)
#   BENCH_SLURM_WAIT_S    how long to wait for the nodes to become idle (default 60)
#   BENCH_SLURM_NET       the first three octets of the bridge's /24 (default 10.77.0)
#
# A node's slurmd can be stopped (`kill "$(cat /run/slurm/slurmd-node2.pid)"`) to lose that
# node; running this script again starts it, and the node returns to service (the tests of
# a lost node do exactly that, tests/slurm_multinode.rs).
set -euo pipefail

log() { echo "slurm-ci-setup: $*" >&2; }
die() {
  log "FAILED: $*"
  for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log /var/log/munge/munged.log; do
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
# Seconds without an answer after which slurmctld declares a node DOWN.
SLURMD_TIMEOUT_S=4
HOST="$(hostname -s)"
NCPU="$(nproc)"
NET="${BENCH_SLURM_NET:-10.77.0}"
BRIDGE=benchbr0
BRIDGE_ADDR="$NET.1"
# The nodes of partition `multi`: name and the last octet of its address.
MULTI_NODES=(node1 node2)
node_addr() { echo "$NET.1${1#node}"; }

# 1. Packages. Only installed when a binary is missing, so a second run skips apt entirely.
need_install=0
for bin in slurmctld slurmd sbatch squeue scontrol munged ip unshare nsenter; do
  if ! command -v "$bin" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$bin" ] && [ ! -x "/sbin/$bin" ]; then
    need_install=1
  fi
done
if [ "$need_install" -eq 1 ]; then
  log "installing slurmctld slurmd slurm-client munge iproute2 util-linux"
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be stale or absent on a fresh machine; update once, then install.
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge iproute2 \
    util-linux >/dev/null \
    || die "apt-get install slurmctld slurmd slurm-client munge iproute2 util-linux failed"
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

# 3. The network of the `multi` nodes: a bridge on the host and, per node, a network
# namespace joined to it by a veth pair. Each step checks before it acts, so a second run
# changes nothing. slurmctld listens on the bridge's address, which the host's own node and
# the namespaces all reach; a namespace's /etc/hosts (`ip netns exec` mounts
# /etc/netns/NAME/hosts over it) names every node, so ranks find MASTER_ADDR by name and gloo
# finds its own address from its hostname, as on a real cluster.
ns_of() { echo "bench-$1"; }
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  log "creating bridge $BRIDGE ($BRIDGE_ADDR/24)"
  ip link add "$BRIDGE" type bridge || die "cannot create bridge $BRIDGE (no CAP_NET_ADMIN?)"
fi
ip -4 addr show dev "$BRIDGE" | grep -q "inet $BRIDGE_ADDR/" \
  || ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE" || die "cannot give $BRIDGE the address $BRIDGE_ADDR"
ip link set "$BRIDGE" up || die "cannot bring $BRIDGE up"
hosts="$(printf '127.0.0.1 localhost\n%s %s\n' "$BRIDGE_ADDR" "$HOST")"
for n in "${MULTI_NODES[@]}"; do
  hosts="$(printf '%s\n%s %s\n' "$hosts" "$(node_addr "$n")" "$n")"
done
for n in "${MULTI_NODES[@]}"; do
  ns="$(ns_of "$n")"
  addr="$(node_addr "$n")"
  # The host's end of the veth pair is named for the node (at most 15 characters).
  veth="bv-$n"
  if [ ! -e "/run/netns/$ns" ]; then
    log "creating network namespace $ns for node $n ($addr)"
    ip netns add "$ns" || die "ip netns add $ns failed"
  fi
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name "$veth-p" || die "cannot create veth $veth"
    ip link set "$veth-p" netns "$ns" || die "cannot move $veth-p into $ns"
    ip -n "$ns" link set "$veth-p" name eth0 || die "cannot rename $veth-p in $ns"
  fi
  ip link set "$veth" master "$BRIDGE" up || die "cannot attach $veth to $BRIDGE"
  ip -n "$ns" -4 addr show dev eth0 | grep -q "inet $addr/" \
    || ip -n "$ns" addr add "$addr/24" dev eth0 || die "cannot give eth0 in $ns the address $addr"
  ip -n "$ns" link set eth0 up || die "cannot bring eth0 in $ns up"
  ip -n "$ns" link set lo up || die "cannot bring lo in $ns up"
  mkdir -p "/etc/netns/$ns"
  if [ "$(cat "/etc/netns/$ns/hosts" 2>/dev/null)" != "$hosts" ]; then
    printf '%s\n' "$hosts" >"/etc/netns/$ns/hosts"
  fi
done

# 4. slurm.conf: this host is the controller and node `$HOST`; node1 and node2 are the
# namespaces. The daemons run as root so that spool directories need no ownership dance;
# proctrack/linuxproc and task/none avoid cgroups, which containers often lack; no
# accounting daemon (sacct is not needed: bench reads job states from squeue and scontrol).
# Every slurmd has its own spool directory, pid file and log (`%n` is the node's name).
# SlurmdTimeout is short so that a lost node is declared DOWN within seconds (the
# controller pings every SlurmdTimeout/3), and ReturnToService=2 brings it back as soon as
# its slurmd registers again.
mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/log/slurm /run/slurm
for n in "$HOST" "${MULTI_NODES[@]}"; do mkdir -p "/var/spool/slurmd/$n"; done
# Memory the node offers: small and fixed so that the config never exceeds the machine.
MEM_MB=1024
multi_nodes_conf=""
for n in "${MULTI_NODES[@]}"; do
  multi_nodes_conf+="NodeName=$n NodeAddr=$(node_addr "$n") NodeHostname=$n CPUs=${NCPU} RealMemory=${MEM_MB} State=UNKNOWN"$'\n'
done
multi_list="$(IFS=,; echo "${MULTI_NODES[*]}")"
conf="$(cat <<EOC
# Written by bench's scripts/slurm-ci-setup.sh: a CI cluster on one machine.
ClusterName=benchci
SlurmctldHost=${HOST}(${BRIDGE_ADDR})
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
SlurmdTimeout=${SLURMD_TIMEOUT_S}
MessageTimeout=5
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=600
KillWait=5
InactiveLimit=0
Waittime=0
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${NCPU} RealMemory=${MEM_MB} State=UNKNOWN
${multi_nodes_conf}PartitionName=debug Default=YES Nodes=${HOST} MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=multi Nodes=${multi_list} MaxTime=INFINITE State=UP OverSubscribe=YES
EOC
)"
changed=0
if [ ! -f "$CONF_DIR/slurm.conf" ] || [ "$(cat "$CONF_DIR/slurm.conf")" != "$conf" ]; then
  printf '%s\n' "$conf" >"$CONF_DIR/slurm.conf"
  changed=1
fi
export SLURM_CONF="$CONF_DIR/slurm.conf"

# A daemon counts as running when the pid in its pid file is alive. A daemon killed a
# moment ago (a test losing a node) may not have been reaped yet, and `kill -0` succeeds on
# a zombie, so a zombie counts as stopped (its state is the field after the command name
# in /proc/PID/stat).
alive() {
  local pid state
  [ -f "$1" ] || return 1
  pid="$(cat "$1")"
  kill -0 "$pid" 2>/dev/null || return 1
  state="$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)"
  [ "$state" != Z ]
}
stop() {
  if alive "$1"; then
    kill "$(cat "$1")" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$1" || break; sleep 0.1; done
  fi
}
slurmd_pid() { echo "/run/slurm/slurmd-$1.pid"; }

if [ "$changed" -eq 1 ]; then
  log "slurm.conf written to $CONF_DIR/slurm.conf; (re)starting daemons"
  # /run/slurm/slurmd.pid: the single slurmd of this script's earlier versions.
  for p in /run/slurm/slurmd.pid "$(slurmd_pid "$HOST")"; do stop "$p"; done
  for n in "${MULTI_NODES[@]}"; do stop "$(slurmd_pid "$n")"; done
  stop /run/slurm/slurmctld.pid
fi

# 5. Daemons. slurmctld first (the slurmds register with it); all daemonize by default.
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
if ! alive "$(slurmd_pid "$HOST")"; then
  log "starting slurmd of node $HOST"
  slurmd -f "$SLURM_CONF" -N "$HOST" || die "slurmd of node $HOST did not start"
fi
for n in "${MULTI_NODES[@]}"; do
  if ! alive "$(slurmd_pid "$n")"; then
    log "starting slurmd of node $n in network namespace $(ns_of "$n")"
    # The node's network namespace, a UTS namespace for its hostname and a mount namespace
    # in which its hosts file covers /etc/hosts; the daemon, its step daemons and the ranks
    # they start all stay in them. (Not `ip netns exec`: it mounts a fresh /sys without the
    # cgroup file system, and slurmd refuses to start without one.)
    # shellcheck disable=SC2016 # the inner shell expands its own positional parameters
    nsenter --net="/run/netns/$(ns_of "$n")" unshare --uts --mount /bin/sh -c \
      'mount --bind "$3" /etc/hosts && hostname "$1" && exec slurmd -f "$2" -N "$1"' \
      node-start "$n" "$SLURM_CONF" "/etc/netns/$(ns_of "$n")/hosts" \
      || die "slurmd of node $n did not start"
  fi
done

# 6. Wait until every node is idle (or mixed/allocated by a job of a previous run). A node
# left DOWN (e.g. by a test that stopped its slurmd) is resumed once.
deadline=$((SECONDS + WAIT_S))
for n in "$HOST" "${MULTI_NODES[@]}"; do
  resumed=0
  while :; do
    state="$(sinfo -h -N -n "$n" -o '%t' 2>/dev/null | head -n1 || true)"
    case "$state" in
      idle | mix | alloc | comp)
        break
        ;;
      down* | drain* | drng* | fail*)
        if [ "$resumed" -eq 0 ]; then
          log "node $n state '$state'; resuming it"
          scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
          resumed=1
        fi
        ;;
    esac
    if [ "$SECONDS" -ge "$deadline" ]; then
      sinfo -N -l >&2 || true
      scontrol show node "$n" >&2 || true
      die "node $n not idle after ${WAIT_S}s (last state: '${state:-none}')"
    fi
    sleep 0.5
  done
done
log "ready: node $HOST ($NCPU CPUs) in partition debug; nodes $multi_list ($NCPU CPUs each, on bridge $BRIDGE) in partition multi; SLURM_CONF=$SLURM_CONF"
