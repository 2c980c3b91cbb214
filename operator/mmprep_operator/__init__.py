"""mmprep operator: reconciles MultimodalPreprocessor resources into per-GPU-pool runtime Deployments.

Where a concern lives (the layers, and which may import which, are the import contracts in
``pyproject.toml``; ``make lint`` holds the code to them):

- ``api``: the resource's API. Its pydantic models (``spec``, ``status``, ``base`` with the CEL
  rules) are the one source of the CRD schema (``crd``), its Markdown reference (``reference``)
  and validation; ``rbac`` is the ClusterRole the operator needs; ``policy`` is the operator's
  own config file.
- ``logic``: pure, no I/O and no kopf. Nodes and GPUs -> ``pools`` -> ``decide`` (workers per
  pool) -> ``replicas`` -> rendering (``identity``: owner, labels, names; ``pod_parts``: what
  every runtime pod is made of; ``render``: Service, budgets, Deployments; ``probe`` and
  ``calibration``: their Jobs, over ``jobs``), composed by ``plan``. ``status`` folds what a pass
  saw into the status, ``events`` chooses the Events, ``conditions`` names every condition type
  and reason, ``podstates`` says why pods are not ready.
- ``kube``: the one seam to the API server (``KubeApi``, the thing unit tests fake).
- ``control``: what runs: kopf's ``handlers`` and its memo (``state``), the ``controller``
  (watch events -> ``workqueue`` -> workers), ``reconcile`` (one level-triggered pass) and its
  collaborators, one I/O job each (``probe_jobs``, ``calibration_jobs`` over ``shared_jobs``,
  ``applier``, ``status_writer``, ``event_poster``), the watch's view of children
  (``children``) and the Prometheus ``metrics``.
- ``cli`` (``mmprep-operator run|render|crd|crd-reference|rbac|policy-schema``) and ``logs``; the small
  helpers ``yamlio`` and ``bounded`` (the bounded caches).

The worker-count rule itself and what crosses to the runtime (env, probe answer, calibration
report) are the runtime's import-light modules ``mmprep_runtime.sizing``, ``contract`` and
``calibration_report``.
"""

__version__ = "0.1.0"
