#!/usr/bin/env bash
# Stops the local control plane started by hack/cluster-up.sh and removes its state (etcd data,
# certificates, kubeconfig); the last logs move to $CLUSTER_DIR.last-logs. Safe when nothing is up.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
lock_cluster

stop() {  # component [grace-seconds]: SIGTERM, then SIGKILL when it outlives the grace period
  local f="$CLUSTER_DIR/run/$1.pid" pid grace=${2:-5}
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_alive "$1"; then
    log "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq $((grace * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# Reverse start order: clients first, so nothing logs errors about a vanished apiserver or etcd.
# The demo's operator, then the agent with time to stop the processes of the pods it runs.
stop operator 10
stop agent 20
for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop "${COMPONENTS[$i]}"; done
if [ -d "$CLUSTER_DIR" ]; then
  # The logs outlive the state, so a failed CI run can still show why (see .ci/run).
  if [ -d "$CLUSTER_DIR/logs" ]; then
    rm -rf "$CLUSTER_DIR.last-logs"
    mv "$CLUSTER_DIR/logs" "$CLUSTER_DIR.last-logs"
  fi
  rm -rf "$CLUSTER_DIR"
  log "removed $CLUSTER_DIR (logs kept in $CLUSTER_DIR.last-logs)"
fi
log "down"
