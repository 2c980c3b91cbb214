#!/usr/bin/env bash
# Starts a real local Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver (TLS, RBAC,
# ServiceAccount tokens, default admission), kube-controller-manager, kube-scheduler, and the KWOK
# controller for simulated GPU nodes (hack/nodes.yaml). Writes an admin kubeconfig and prints its
# path on stdout. Idempotent: components already running are kept, so a second start takes seconds.
#
# The binaries come from hack/build-control-plane.sh (built once per version, cached). State lives
# in $MMPREP_CLUSTER_DIR (default ~/.cache/mmprep/cluster); hack/cluster-down.sh removes it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$HACK_DIR/system-packages.sh" tools

BIN=$("$HACK_DIR/build-control-plane.sh")
lock_cluster
PKI="$CLUSTER_DIR/pki"
mkdir -p "$CLUSTER_DIR"/{pki,run,logs,etcd,kubeconfig}
chmod 700 "$CLUSTER_DIR" "$CLUSTER_DIR/etcd"

if all_up && ! agent_stale; then
  log "already up (apiserver https://127.0.0.1:$APISERVER_PORT)"
  echo "$KUBECONFIG_ADMIN"
  exit 0
fi

# --- certificates (once per cluster; cluster-down removes them) -----------------------------------
sign() {  # name subject [extensions]: a key and a certificate signed by the cluster CA
  local name=$1 subj=$2 ext=${3:-"extendedKeyUsage=clientAuth"}
  openssl req -new -newkey rsa:2048 -nodes -subj "$subj" \
    -keyout "$PKI/$name.key" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 365 -sha256 -out "$PKI/$name.crt" -extfile <(printf 'basicConstraints=CA:FALSE\n%s\n' "$ext") 2>/dev/null
  rm -f "$PKI/$name.csr"
}
if [ ! -f "$PKI/admin.crt" ]; then
  log "creating certificates in $PKI"
  openssl req -x509 -new -newkey rsa:2048 -nodes -days 3650 -subj "/CN=mmprep-local-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  sign apiserver "/CN=kube-apiserver" \
    "extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  # Identities the bootstrap RBAC policy already knows, so no role has to be written by hand.
  sign kube-controller-manager "/CN=system:kube-controller-manager"
  sign kube-scheduler "/CN=system:kube-scheduler"
  sign admin "/O=system:masters/CN=mmprep-admin"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
fi

kubeconfig() {  # identity output-file: a kubeconfig with the certificates embedded
  local who=$1 out=$2
  cat >"$out" <<KC
apiVersion: v1
kind: Config
clusters:
- name: mmprep-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $who
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$who.crt")
    client-key-data: $(base64 -w0 "$PKI/$who.key")
contexts:
- name: mmprep-local
  context: {cluster: mmprep-local, user: $who, namespace: default}
current-context: mmprep-local
KC
  chmod 600 "$out"
}
kubeconfig admin "$KUBECONFIG_ADMIN"
kubeconfig kube-controller-manager "$CLUSTER_DIR/kubeconfig/kube-controller-manager"
kubeconfig kube-scheduler "$CLUSTER_DIR/kubeconfig/kube-scheduler"

# --- processes ---------------------------------------------------------------------------------
start() {  # component args...: runs detached (own session) so it outlives this script
  local name=$1; shift
  if pid_alive "$name"; then log "$name already running"; return 0; fi
  log "starting $name (log: $CLUSTER_DIR/logs/$name.log)"
  # 9>&-: the component must not inherit (and so hold forever) the cluster lock.
  setsid "$BIN/$name" "$@" >>"$CLUSTER_DIR/logs/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$CLUSTER_DIR/run/$name.pid"
}

etcd_healthy() { curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }
component_healthy() {  # port: the secure /healthz every control-plane component serves unauthenticated
  curl -fsSk --max-time 2 "https://127.0.0.1:$1/healthz" >/dev/null 2>&1
}
kwok_healthy() { curl -fsS --max-time 2 "http://127.0.0.1:$KWOK_PORT/healthz" >/dev/null 2>&1; }

start etcd --name mmprep --data-dir "$CLUSTER_DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "mmprep=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync --quota-backend-bytes=4294967296 --log-level=warn
wait_until etcd 60 etcd_healthy

# Admission: the release's default plugin set (ServiceAccount, defaulting of Pods, ResourceQuota,
# PodSecurity, ...) stays on; only the endpoint reconciler is off because it rejects a loopback
# advertise address for the `kubernetes` Service.
start kube-apiserver \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --endpoint-reconciler-type none \
  --allow-privileged=true --profiling=false \
  --max-requests-inflight 800 --max-mutating-requests-inflight 400
wait_until kube-apiserver 120 apiserver_ready

KCM_KC="$CLUSTER_DIR/kubeconfig/kube-controller-manager"
# Per-controller ServiceAccount credentials, so controllers run with their bootstrap roles as in a
# real cluster. API QPS is raised from 20 because the scale benchmark creates hundreds of objects.
start kube-controller-manager \
  --kubeconfig "$KCM_KC" --authentication-kubeconfig "$KCM_KC" --authorization-kubeconfig "$KCM_KC" \
  --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
  --use-service-account-credentials=true \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
  --controllers '*,-cloud-node-lifecycle,-nodeipam' \
  --kube-api-qps 200 --kube-api-burst 400
SCHED_KC="$CLUSTER_DIR/kubeconfig/kube-scheduler"
start kube-scheduler \
  --kubeconfig "$SCHED_KC" --authentication-kubeconfig "$SCHED_KC" --authorization-kubeconfig "$SCHED_KC" \
  --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false
# KWOK manages only nodes annotated as fake (hack/nodes.yaml); the test agent's node is real.
start kwok --kubeconfig "$KUBECONFIG_ADMIN" --config "$HACK_DIR/kwok/stages.yaml" \
  --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --server-address "127.0.0.1:$KWOK_PORT" --cidr 10.244.0.0/16 --node-ip 10.250.0.1 \
  --node-lease-duration-seconds 40
wait_until kube-controller-manager 60 component_healthy "$KCM_PORT"
wait_until kube-scheduler 60 component_healthy "$SCHEDULER_PORT"
wait_until kwok 60 kwok_healthy

# Pods need their namespace's `default` ServiceAccount (admission rejects them until the
# controller-manager has made it), so "up" means that controller works too.
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
sa_ready() { kc get serviceaccount default -n default -o name >/dev/null 2>&1; }
wait_until "ServiceAccount controller" 60 sa_ready

log "applying simulated nodes from hack/nodes.yaml"
kc apply -f "$HACK_DIR/nodes.yaml" >/dev/null
kwok_nodes_ready() {
  local want got
  want=$(kc get nodes -l mmprep.dev/simulated=true -o name | wc -l)
  got=$(kc get nodes -l mmprep.dev/simulated=true \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true)
  [ "$want" -gt 0 ] && [ "$got" -eq "$want" ]
}
wait_until "simulated nodes" 60 kwok_nodes_ready
# The test agent (tests/support/agent.py) owns the one node where pods really run, as local
# processes. It is test infrastructure: tainted so only pods that tolerate it (the probe, a test's
# runtime pod) land there. Restarted when its code changed since it started.
AGENT_PY="$REPO_DIR/tests/support/agent.py"
PYTHON=${MMPREP_PYTHON:-$REPO_DIR/.venv/bin/python}
if [ "${MMPREP_AGENT:-1}" = 1 ]; then
  [ -x "$PYTHON" ] || die "no Python at $PYTHON for the test agent (run 'make venv' or set MMPREP_PYTHON)"
  if pid_alive agent && agent_stale; then
    log "agent code changed; restarting the agent"
    kill "$(cat "$CLUSTER_DIR/run/agent.pid")"
    agent_gone() { ! pid_alive agent; }
    wait_until "old agent exit" 30 agent_gone
  fi
  if ! pid_alive agent; then
    log "starting the test agent (log: $CLUSTER_DIR/logs/agent.log)"
    setsid "$PYTHON" "$AGENT_PY" --kubeconfig "$KUBECONFIG_ADMIN" --workdir "$CLUSTER_DIR/agent" \
      --node-name mmprep-agent --taint >>"$CLUSTER_DIR/logs/agent.log" 2>&1 </dev/null 9>&- &
    echo $! >"$CLUSTER_DIR/run/agent.pid"
  fi
  agent_ready() {
    [ "$(kc get node mmprep-agent -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
  }
  wait_until "test agent node" 60 agent_ready
fi
log "up: export KUBECONFIG=$KUBECONFIG_ADMIN (kubectl: $BIN/kubectl)"
echo "$KUBECONFIG_ADMIN"
