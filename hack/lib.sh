# Shared settings of the local control plane scripts (sourced, not run).
#
# Every path and port is overridable so two checkouts (or CI and a developer) can run side by
# side; the defaults stay off the well-known ports (6443, 2379, 10257, ...) a real cluster uses.
CLUSTER_DIR=${MMPREP_CLUSTER_DIR:-$HOME/.cache/mmprep/cluster}
ETCD_PORT=${MMPREP_ETCD_PORT:-12379}
ETCD_PEER_PORT=${MMPREP_ETCD_PEER_PORT:-12380}
APISERVER_PORT=${MMPREP_APISERVER_PORT:-16443}
KCM_PORT=${MMPREP_KCM_PORT:-16257}
SCHEDULER_PORT=${MMPREP_SCHEDULER_PORT:-16259}
KWOK_PORT=${MMPREP_KWOK_PORT:-16247}
SERVICE_CIDR=10.96.0.0/16
KUBECONFIG_ADMIN="$CLUSTER_DIR/admin.kubeconfig"
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$HACK_DIR")
# Start order matters: etcd before the apiserver, the apiserver before its clients.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { printf '[%s %s] %s\n' "$(basename "$0" .sh)" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

pid_alive() {  # component -> 0 when its recorded process still runs
  local f="$CLUSTER_DIR/run/$1.pid" pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  # The command line check guards against a recycled pid after a reboot or a crash.
  kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$1"
}

apiserver_ready() {
  [ -f "$CLUSTER_DIR/pki/admin.crt" ] || return 1
  curl -fsS --max-time 3 --cacert "$CLUSTER_DIR/pki/ca.crt" \
    --cert "$CLUSTER_DIR/pki/admin.crt" --key "$CLUSTER_DIR/pki/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null 2>&1
}

all_up() {  # every component (and the agent) runs and the apiserver is ready
  for c in "${COMPONENTS[@]}"; do pid_alive "$c" || return 1; done
  if [ "${MMPREP_AGENT:-1}" = 1 ]; then pid_alive agent || return 1; fi
  apiserver_ready
}

agent_stale() {  # the running agent started before its code last changed
  [ "${MMPREP_AGENT:-1}" = 1 ] || return 1
  local f
  for f in "$REPO_DIR"/tests/support/agent*.py; do
    [ "$f" -nt "$CLUSTER_DIR/run/agent.pid" ] && return 0
  done
  return 1
}

wait_until() {  # what timeout-seconds command...: polls a condition, fails with the log to read
  local what=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    [ $SECONDS -lt $deadline ] || die "$what not ready after ${timeout}s; see $CLUSTER_DIR/logs/"
    sleep 0.5
  done
  log "$what ready"
}

lock_cluster() {  # serializes cluster-up/cluster-down/demo: concurrent starts would double-start components
  mkdir -p "$(dirname "$CLUSTER_DIR")"
  exec 9>"$CLUSTER_DIR.lock"
  if ! flock -n 9; then
    log "waiting for another cluster-up/down on $CLUSTER_DIR"
    flock -w 600 9 || die "another cluster-up/down held $CLUSTER_DIR.lock for 10 minutes"
  fi
}
