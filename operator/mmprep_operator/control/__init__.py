"""What runs the operator: kopf's handlers, the controller and its work queue, the reconcile pass
and its collaborators (one I/O job each), all over the API seam ``mmprep_operator.kube``.
"""
