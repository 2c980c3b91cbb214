"""Fixtures of the packaging tests (tests/e2e): namespaces no shared test operator watches.

The session's test operator (tests/conftest.py) watches the `it-*` namespaces. The RBAC proof
and the operator-image test run an operator of their own with the chart's ServiceAccount token,
and must be the only operator reconciling their resource, so they use `pkg-*` namespaces, which
also enforce the restricted Pod Security Standard.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kube import Kube, wait_for

PRIVATE_PREFIX = "pkg-"


@pytest.fixture
def private_namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{PRIVATE_PREFIX}{stem}-{uuid.uuid4().hex[:5]}"
    # Pod Security Admission enforces the restricted standard here: every pod the chart or the
    # operator makes in these namespaces (probe Job, runtime Deployments) must pass it.
    labels = {"mmprep.dev/test": "true", "pod-security.kubernetes.io/enforce": "restricted"}
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    wait_for(lambda: kube.core.read_namespaced_service_account("default", name), 30, what=f"ServiceAccount {name}/default")
    yield name
    with contextlib.suppress(ApiException):
        kube.core.delete_namespace(name)
