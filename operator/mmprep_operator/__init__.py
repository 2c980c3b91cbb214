"""mmprep operator: reconciles MultimodalPreprocessor resources into per-GPU-pool runtime Deployments.

Where a concern lives (the layers, and which may import which, are the import contracts in
``pyproject.toml``; ``make lint`` holds the code to them):

- ``api``: the resource's API. Its pydantic models (``spec``, ``status``, ``base`` with the CEL
  rules) are the one source of the CRD schema (``crd``), its Markdown reference (``reference``)
  and validation; ``rbac`` is the ClusterRole the operator needs; ``policy`` is the operator's
  own config file.
- ``logic``: pure, no I/O and no kopf. Nodes and GPUs -> ``pools`` -> ``decide`` (workers per
  pool) -> ``replicas`` -> manifests (``identity``: owner, labels, names; ``pod_parts``: what
  every runtime pod is made of; ``manifests``: Service, budgets, Deployments; ``autoscaling``:
  HPA or ScaledObject; ``probe`` and ``calibration``: their Jobs, over ``jobs``), composed by
  ``plan``; ``leadership`` is the lease's arithmetic. ``status`` folds what a pass
  saw into the status, ``events`` chooses the Events, ``conditions`` names every condition type
  and reason, ``podstates`` says why pods are not ready.
- ``kube``: the one seam to the API server (``KubeApi``, the thing unit tests fake).
- ``control``: what runs: kopf's ``handlers`` and its memo (``state``), the ``controller``
  (watch events -> ``workqueue`` -> workers), ``reconcile`` (one level-triggered pass), its
  ``planner`` and its collaborators, one I/O job each (``probe_jobs``, ``calibration_jobs`` over
  ``shared_jobs``, ``applier``, ``autoscalers``, ``reference_checker``, ``engine_checker``,
  ``status_writer``, ``event_poster``), the watch's view of children (``children``), the Prometheus ``metrics`` and
  the leader election (``leadership``).
- ``cli`` (``mmprep-operator run|render|crd|crd-reference|rbac|policy-schema``) and ``logs``; the small
  helpers ``yamlio`` and ``bounded`` (the bounded caches).

The worker-count rule itself and what crosses to the runtime (env, probe answer, calibration
report, settings, log fields) are the runtime's import-light modules (``mmprep_runtime.sizing``,
``contract``, ``calibration_report`` and the rest named in the contract "The operator imports from
the runtime only its import-light contract modules"): the only runtime modules it may import.
"""

__version__ = "0.1.0"
