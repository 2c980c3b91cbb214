#!/usr/bin/env bash
# `make demo`: the whole loop on the local control plane, from nothing to decisions on screen.
#   1. start the cluster (building its binaries the first time) with KWOK H200/GB300/CPU nodes and
#      the test agent's node, where pods run for real as local processes;
#   2. install the CRD and run the operator in the background (log: $CLUSTER_DIR/logs/operator.log);
#   3. build real processor folders (no hub needed) and apply examples/ plus hack/demo/resources.yaml;
#   4. wait until every resource is Ready, then show `kubectl get mmp -o wide`, their pools, and a
#      real preprocessing request to the one runtime pod the agent runs.
# Idempotent: run it again to re-apply; `make cluster-down` stops everything and removes the state.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

NAMESPACE=${MMPREP_DEMO_NAMESPACE:-mmprep-demo}
PYTHON=${MMPREP_PYTHON:-$REPO_DIR/.venv/bin/python}
VENV_BIN=$(dirname "$PYTHON")
OPERATOR_HEALTH_PORT=${MMPREP_DEMO_HEALTH_PORT:-16081}
OPERATOR_METRICS_PORT=${MMPREP_DEMO_METRICS_PORT:-16080}

KUBECONFIG=$("$HACK_DIR/cluster-up.sh")
export KUBECONFIG
BIN=$("$HACK_DIR/build-control-plane.sh")
kc() { "$BIN/kubectl" "$@"; }

log "installing the CRD (crds/)"
kc apply --server-side --force-conflicts -f "$REPO_DIR/crds/" >/dev/null
kc wait --for condition=Established --timeout=60s crd/multimodalpreprocessors.mmprep.dev >/dev/null
kc api-resources --api-group=mmprep.dev >/dev/null  # refreshes kubectl's discovery cache
# A new CRD's storage answers 429 "(re)initializing" for a moment; start the operator after that.
crd_serves() { kc get mmp --all-namespaces -o name >/dev/null 2>&1; }
wait_until "CRD storage" 60 crd_serves

# The operator runs from this checkout, so a demo after a code change shows that change.
if pid_alive operator; then
  log "restarting the operator"
  kill "$(cat "$CLUSTER_DIR/run/operator.pid")"
  operator_gone() { ! pid_alive operator; }
  wait_until "old operator exit" 30 operator_gone
fi
log "starting the operator (log: $CLUSTER_DIR/logs/operator.log)"
# Scoped to the demo namespace, so it never competes with the operator the tests run.
setsid "$VENV_BIN/mmprep-operator" run --namespace "$NAMESPACE" --kubeconfig "$KUBECONFIG" \
  --policy-file "$HACK_DIR/demo/policy.yaml" --bind-address 127.0.0.1 \
  --liveness-port "$OPERATOR_HEALTH_PORT" --metrics-port "$OPERATOR_METRICS_PORT" \
  >>"$CLUSTER_DIR/logs/operator.log" 2>&1 </dev/null &
echo $! >"$CLUSTER_DIR/run/operator.pid"
operator_live() { curl -fsS --max-time 2 "http://127.0.0.1:$OPERATOR_HEALTH_PORT/healthz" >/dev/null 2>&1; }
wait_until operator 60 operator_live

MODELS="$CLUSTER_DIR/models"
for kind in qwen2-vl llava uncloneable; do
  if [ ! -d "$MODELS/$kind" ]; then
    log "building model folder $kind (real transformers classes, a small trained tokenizer)"
    "$VENV_BIN/mmprep-runtime" make-model --kind "$kind" --out "$MODELS/$kind" >/dev/null
  fi
done

log "applying examples/*.yaml and hack/demo/resources.yaml to namespace $NAMESPACE"
kc create namespace "$NAMESPACE" --dry-run=client -o yaml | kc apply -f - >/dev/null
"$PYTHON" "$HACK_DIR/demo/localize.py" --models "$MODELS" "$REPO_DIR"/examples/*.yaml "$HACK_DIR/demo/resources.yaml" \
  | kc apply -n "$NAMESPACE" -f -

# One line per change of the count (a `\r`-updated line piles up in logs that are not a terminal).
last_ready=""
all_ready() {
  local want got
  want=$(kc get mmp -n "$NAMESPACE" -o name | wc -l)
  got=$(kc get mmp -n "$NAMESPACE" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true)
  if [ "$got/$want" != "$last_ready" ]; then log "$got/$want resources Ready"; last_ready="$got/$want"; fi
  [ "$want" -gt 0 ] && [ "$got" -eq "$want" ]
}
log "waiting for every resource to be Ready (probes run for real on the agent's node)"
wait_until "all resources" 300 all_ready

echo
echo "\$ kubectl get mmp -n $NAMESPACE -o wide"
kc get mmp -n "$NAMESPACE" -o wide
echo
echo "Pools (one Deployment each, sized by the decision):"
kc get mmp -n "$NAMESPACE" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{range .status.pools[*]}{"  "}{.name}{": "}{.nodes}{" node(s), "}{.path}{" path, "}{.processorWorkers}{" processor / "}{.ioWorkers}{" io workers, "}{.reason}{", "}{.readyReplicas}{"/"}{.replicas}{" ready -> "}{.deployment}{"\n    "}{.message}{"\n"}{end}{end}'
echo
echo "Probe and cloneability:"
kc get mmp -n "$NAMESPACE" -o jsonpath='{range .items[*]}{"  "}{.metadata.name}{": "}{.status.conditions[?(@.type=="Cloneable")].reason}{" - "}{.status.conditions[?(@.type=="Cloneable")].message}{"\n"}{end}'
echo
echo "\$ kubectl get deployments -n $NAMESPACE"
kc get deployments -n "$NAMESPACE" -L mmprep.dev/pool

pod=$(kc get pods -n "$NAMESPACE" -l mmprep.dev/resource=llava-served --field-selector status.phase=Running -o name | head -1)
port=$(kc get -n "$NAMESPACE" "$pod" -o jsonpath='{.metadata.annotations.agent\.mmprep\.dev/ports}' | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["8080"])')
echo
echo "A real request to $pod (run by the test agent on local port $port):"
"$PYTHON" - "$port" <<'PY'
import base64, io, json, sys, urllib.request
from PIL import Image
buf = io.BytesIO(); Image.new("RGB", (320, 240), (30, 120, 200)).save(buf, format="JPEG")
body = json.dumps({"text": "<image>\nWhat is in this picture?", "images": [base64.b64encode(buf.getvalue()).decode()]}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/preprocess", data=body, headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=60) as resp:
    answer = json.load(resp)
summary = {k: v for k, v in answer.items() if k != "input_ids"}
print(f"  POST /v1/preprocess -> {resp.status}: {len(answer['input_ids'][0]) if answer['input_ids'] and isinstance(answer['input_ids'][0], list) else len(answer['input_ids'])} input ids;", json.dumps(summary)[:400])
PY
echo
log "done. KUBECONFIG=$KUBECONFIG; kubectl: $BIN/kubectl; operator log: $CLUSTER_DIR/logs/operator.log; stop with: make cluster-down"
