"""`helm test`: a MultimodalPreprocessor goes Ready on this cluster, then is deleted.

Runs in the operator image (Python and the kubernetes client are there) with a ServiceAccount that
may only create, read and delete MultimodalPreprocessors in the test namespace. Prints the
resource's status as it changes, and the Ready condition's reason when it fails.
"""

import json
import os
import sys
import time

from kubernetes import client, config

GROUP, VERSION, PLURAL = "mmprep.dev", "v1alpha1", "multimodalpreprocessors"
namespace, name = os.environ["TEST_NAMESPACE"], os.environ["TEST_NAME"]
deadline = time.monotonic() + float(os.environ.get("TEST_TIMEOUT_SECONDS", "600"))
config.load_incluster_config()
api = client.CustomObjectsApi()
body = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "MultimodalPreprocessor",
    "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "helm-test"}},
    "spec": json.loads(os.environ["TEST_SPEC"]),
}
try:
    api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    while time.monotonic() < deadline:  # a resource of an earlier, interrupted run
        api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        time.sleep(1)
except client.ApiException as exc:
    if exc.status != 404:
        raise
api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
print(f"created {namespace}/{name}; waiting for Ready", flush=True)
last, ready = None, None
try:
    while time.monotonic() < deadline:
        status = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions", [])}
        ready = conditions.get("Ready")
        summary = {t: (c["status"], c.get("reason")) for t, c in conditions.items()}
        if summary != last:
            print(json.dumps(summary), flush=True)
            last = summary
        if ready and ready["status"] == "True":
            pools = [(p.get("name"), p.get("path"), p.get("processorWorkers"), p.get("reason")) for p in status.get("pools", [])]
            print(f"Ready: pools {pools}", flush=True)
            sys.exit(0)
        time.sleep(2)
    print(f"not Ready in time: {json.dumps(ready)}", flush=True)
    sys.exit(1)
finally:
    api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
