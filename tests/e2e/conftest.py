"""Fixtures of the packaging tests (tests/e2e): namespaces no shared test operator watches.

The session's test operator (tests/conftest.py) watches the `it-*` namespaces. The RBAC proof
and the operator-image test run an operator of their own with the chart's ServiceAccount token,
and must be the only operator reconciling their resource, so they use `pkg-*` namespaces, which
also enforce the restricted Pod Security Standard.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kind_bringup import BRINGUP, KindBringUp, kind_down
from support.kube import Kube, wait_for
from support.packaging_support import docker_engine
from support.tier_times import TierTimes

PRIVATE_PREFIX = "pkg-"
KIND_TESTS = "test_kind_e2e.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The kind tests run last, and their cluster's bring-up starts behind the tiers before them.

    It starts when the first test outside tests/compat does (``_BringUpAfterCompat``): the
    compatibility tier is CPU-bound, and a kind cluster brought up beside it, then idling there,
    took a third of its two cores (the tier took 1,092 s in a whole session against 721 s alone on
    one machine). The tiers after it mostly wait on an API server. ``MMPREP_KIND_EARLY=0`` brings
    the cluster up only when the kind tests start.
    """
    kind = [item for item in items if item.path.name == KIND_TESTS]
    if not kind:
        return
    items[:] = [item for item in items if item.path.name != KIND_TESTS] + kind
    early = os.environ.get("MMPREP_KIND_EARLY", "1") == "1" and not config.option.collectonly
    if early and docker_engine() is None:
        config.pluginmanager.register(_BringUpAfterCompat(config), "mmprep-kind-bringup")


class _BringUpAfterCompat:
    """Starts the kind bring-up as the first test outside tests/compat is set up (a plugin, not a
    conftest hook: a conftest's setup hooks see only the tests under its folder)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if BRINGUP in self.config.stash or TierTimes.tier_of(item.nodeid) == "compat":
            return
        self.config.stash[BRINGUP] = KindBringUp()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A bring-up whose tests never ran (a failure with -x, an interrupt) leaves no cluster behind."""
    bringup = session.config.stash.get(BRINGUP, None)
    if bringup is not None and not bringup.consumed:
        bringup.stop()
        if os.environ.get("MMPREP_KEEP_KIND") != "1":
            kind_down()


@pytest.fixture
def other_namespace(kube: Kube) -> Iterator[str]:
    """A namespace no operator watches and no test binds anyone in."""
    name = f"not-watched-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"mmprep.dev/test": "true"})))
    yield name
    with contextlib.suppress(ApiException):
        kube.core.delete_namespace(name)


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
