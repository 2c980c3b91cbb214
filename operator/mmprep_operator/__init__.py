"""mmprep operator: reconciles MultimodalPreprocessor resources into per-GPU-pool runtime Deployments.

Layers, imported in one direction only (a unit test checks that the pure layer stays pure):

- pure, no I/O, no kopf: ``api`` (models, the CRD's source) -> ``gpus``, ``nodes``, ``naming``,
  ``replicas``, ``config`` -> ``pools``, ``decide`` -> ``render``, ``probe``, ``status`` -> ``plan``;
  ``crd`` and ``rbac`` print generated manifests;
- the seam to the API server: ``kube`` (the only module that makes HTTP calls);
- I/O collaborators of one reconcile, one job each: ``probe_jobs`` and ``calibration_jobs`` (the
  Jobs that answer, with ``shared_jobs``), ``applier`` (apply and prune children),
  ``status_writer`` (the status write), ``event_poster`` (delivers the Events ``status`` builds);
- orchestration: ``reconcile`` (the pass of one resource, level-triggered, composing the
  collaborators), ``controller`` (events -> queue -> workers), ``workqueue``, ``metrics``;
- adapters: ``handlers`` (kopf), ``state`` (what kopf's memo holds), ``cli``, ``logs``.
"""

__version__ = "0.1.0"
