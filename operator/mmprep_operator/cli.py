"""``mmprep-operator``: run the operator, or print what it would create (render, crd, crd-reference, rbac).

Nothing is parsed or connected at import time; ``main`` does it all. Exit codes: 0 success,
2 bad input (flags, files, an invalid resource), 1 anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pathlib
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from mmprep_operator import __version__, api, yamlio
from mmprep_operator.api import crd, rbac, reference
from mmprep_operator.api.policy import (
    DEFAULT_LIVENESS_PORT,
    DEFAULT_METRICS_PORT,
    DEFAULT_URGENT_WORKERS,
    DEFAULT_WORKERS,
    OperatorPolicy,
    PolicyError,
    load_policy,
)
from mmprep_operator.logic import identity
from mmprep_operator.logic.leadership import DEFAULT_LEASE_SECONDS

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user; printed without a traceback, exit 2."""


# ------------------------------------------------------------------------------------- render

# Without --probe, render assumes the answer most processors give, and says so.
ASSUMED_PROBE: dict[str, Any] = {"cloneable": True, "fast_image_processor": True, "declared_workers": None}


def _read(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else pathlib.Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from e


def _load_resource(path: str) -> tuple[dict[str, Any], api.MultimodalPreprocessorSpec]:
    try:
        objects = [o for o in yamlio.load_objects(_read(path)) if o.get("kind") == api.KIND]
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from e
    except Exception as e:  # yaml.YAMLError and friends
        raise UsageError(f"{path} is not valid YAML: {e}") from e
    if len(objects) != 1:
        raise UsageError(f"{path} must hold exactly one {api.KIND}, found {len(objects)}")
    body = objects[0]
    if not (body.get("metadata") or {}).get("name"):
        raise UsageError(f"{path}: metadata.name is required")
    try:
        spec = api.MultimodalPreprocessorSpec.model_validate(body.get("spec") or {})
    except ValidationError as e:
        raise UsageError(f"{path}: invalid {api.KIND}: {api.describe_validation_error(e)}") from e
    return body, spec


def _load_nodes(path: str) -> list[Any]:
    from mmprep_operator.logic.nodes import node_facts

    try:
        objects = yamlio.load_objects(_read(path))
    except Exception as e:
        raise UsageError(f"{path} is not valid YAML: {e}") from e
    nodes = [o for o in objects if o.get("kind", "Node") == "Node"]
    if not nodes:
        raise UsageError(f"{path} holds no Node objects")
    return [node_facts(n) for n in nodes]


def _load_probe(path: str | None) -> tuple[api.ProbeResult, bool]:
    from mmprep_operator.logic.probe import parse_result

    if path is None:
        return api.ProbeResult.model_validate(ASSUMED_PROBE), True
    try:
        return parse_result(_read(path)), False
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from e


def _policy(path: str | None) -> OperatorPolicy:
    try:
        return load_policy(path)
    except PolicyError as e:
        raise UsageError(str(e)) from e


def cmd_render(args: argparse.Namespace) -> int:
    from mmprep_operator.logic import probe
    from mmprep_operator.logic.decide import sentence
    from mmprep_operator.logic.plan import make_plan

    body, spec = _load_resource(args.file)
    nodes = _load_nodes(args.nodes)
    result, assumed = _load_probe(args.probe)
    policy = _policy(args.policy_file)
    meta = body["metadata"]
    owner = identity.Owner(name=meta["name"], namespace=meta.get("namespace") or args.namespace, uid=meta.get("uid"))
    plan = make_plan(owner, spec, nodes, result, policy)

    lines = [f"# mmprep-operator render: {api.KIND} {owner.namespace}/{owner.name}"]
    if assumed:
        lines.append("# no --probe given: assuming a cloneable processor with a fast image processor")
    if plan.problem is not None:
        lines.append(f"# {plan.problem.reason}: {plan.problem.message}")
    if plan.scaling:
        lines.append("# autoscaling: assuming the cluster has metrics-server and KEDA (the operator detects them)")

    def sized(pool: str) -> str:
        s = plan.scaling.get(pool)
        if s is None:
            return f"{plan.replicas[pool]} replica(s)"
        return f"{s.min_replicas}..{s.max_replicas} replicas by {s.engine} (starting at {plan.replicas[pool]})"

    lines += [f"# {sentence(d)}; {sized(d.pool.name)} on {len(d.pool.nodes)} node(s)" for d in plan.decisions]
    objects = list(plan.objects)
    if args.with_probe_job:
        reprobe = (meta.get("annotations") or {}).get(probe.ANNOTATION_REPROBE)
        objects.insert(0, probe.job_manifest(owner, spec, policy, probe.probe_hash(spec, policy, reprobe)))
    sys.stdout.write("\n".join(lines) + "\n---\n" + yamlio.dump_all(objects))
    return 0


# ---------------------------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    import kopf

    from mmprep_operator import logs
    from mmprep_operator.control.controller import Controller
    from mmprep_operator.control.handlers import build_registry
    from mmprep_operator.control.metrics import Metrics
    from mmprep_operator.control.state import OperatorState
    from mmprep_operator.kube import load_configuration

    policy = _policy(args.policy_file)
    try:
        # Fail here, with one clear line, rather than deep inside kopf's login retries.
        load_configuration(args.kubeconfig, args.context)
    except Exception as e:  # ConfigException, a missing or unreadable file, a bad context
        raise UsageError(f"no usable Kubernetes credentials (in-cluster, --kubeconfig or KUBECONFIG): {e}") from e
    if args.default_image:
        policy = policy.model_copy(update={"default_image": args.default_image})
    logs.configure(args.log_format, verbose=args.verbose)
    metrics = Metrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.bind_address)
    state = OperatorState(
        policy=policy,
        metrics=metrics,
        controller=Controller(
            metrics=metrics, resync_seconds=policy.resync_seconds, workers=args.workers, urgent_workers=args.urgent_workers
        ),
        kubeconfig=args.kubeconfig,
        context=args.context,
    )
    namespaces = list(args.namespace or ())
    liveness = f"http://{args.bind_address}:{args.liveness_port}/healthz" if args.liveness_port else None
    logging.getLogger("mmprep.operator").info(
        "starting",
        extra={
            "version": __version__,
            "namespaces": namespaces or "all",
            "metrics_port": args.metrics_port,
            "liveness": liveness,
            "default_image": policy.default_image,
        },
    )

    def run_kopf(loop: asyncio.AbstractEventLoop | None = None, stop_flag: asyncio.Future[None] | None = None) -> None:
        # standalone: kopf's own peering stays off; the Lease (--leader-election) decides who runs.
        kopf.run(
            loop=loop,
            registry=build_registry(),
            memo=kopf.Memo(state=state),
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
        )

    if not args.leader_election:
        run_kopf()
        return 0
    from mmprep_operator.control.leadership import Elector, LeaderMetrics, run_operator_with_lease
    from mmprep_operator.logic.leadership import LeaseTerms

    lease_namespace = args.leader_election_namespace or os.environ.get("POD_NAMESPACE")
    if not lease_namespace:
        raise UsageError("--leader-election needs --leader-election-namespace (or POD_NAMESPACE)")
    try:
        terms = LeaseTerms(duration=args.lease_seconds)
    except ValueError as e:
        raise UsageError(str(e)) from e
    # The pod name (downward API) says which replica leads in `kubectl get lease`; the suffix keeps
    # two processes of one pod (or one host, outside a cluster) apart.
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    elector = Elector(lease_namespace, args.leader_election_id, identity, terms)
    return run_operator_with_lease(
        elector,
        run_kopf,
        metrics=LeaderMetrics(metrics.registry),
        kubeconfig=args.kubeconfig,
        context=args.context,
        liveness=(args.bind_address, args.liveness_port),
    )


# ----------------------------------------------------------------------------------- parsing


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmprep-operator", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator (one replica, or one of several with --leader-election)")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", metavar="NS", help="watch this namespace (repeatable; globs allowed)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch all namespaces (the default)")
    run.add_argument("--policy-file", metavar="FILE", help="operator policy YAML (image, overrides, probe defaults)")
    run.add_argument(
        "--default-image", metavar="IMAGE", help="runtime image when a resource names none (wins over the policy file)"
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        metavar="PORT",
        help="Prometheus metrics port; 0 disables (default %(default)s)",
    )
    run.add_argument(
        "--liveness-port",
        "--health-port",
        dest="liveness_port",
        type=int,
        default=DEFAULT_LIVENESS_PORT,
        metavar="PORT",
        help="liveness endpoint port, served at /healthz; 0 disables (default %(default)s)",
    )
    run.add_argument(
        "--bind-address", default="0.0.0.0", metavar="ADDR", help="address for metrics and liveness (default 0.0.0.0)"
    )
    run.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, metavar="N", help="concurrent reconciles (default %(default)s)"
    )
    run.add_argument(
        "--urgent-workers",
        type=int,
        default=DEFAULT_URGENT_WORKERS,
        metavar="N",
        help="more concurrent reconciles for node changes only, mostly status writes (default %(default)s)",
    )
    run.add_argument(
        "--leader-election",
        action="store_true",
        help="run as one of several replicas: reconcile only while holding the leader Lease (docs/operations.md)",
    )
    run.add_argument(
        "--leader-election-id", default=rbac.LEADER_ELECTION_ID, metavar="NAME", help="the Lease's name (default %(default)s)"
    )
    run.add_argument("--leader-election-namespace", metavar="NS", help="the Lease's namespace (default: POD_NAMESPACE)")
    run.add_argument(
        "--lease-seconds",
        type=float,
        default=DEFAULT_LEASE_SECONDS,
        metavar="S",
        help="how long an unrenewed Lease lasts; a standby takes over that long after the leader died (default %(default)s)",
    )
    run.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, else KUBECONFIG or ~/.kube/config)")
    run.add_argument("--context", metavar="NAME", help="kubeconfig context")
    run.add_argument("--log-format", choices=("json", "text"), default="json", help="log line format (default json)")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.set_defaults(func=cmd_run)

    render = sub.add_parser("render", help="print the objects the operator would apply, without a cluster")
    render.add_argument("-f", "--file", required=True, metavar="CR.yaml", help=f"a {api.KIND} resource ('-' for stdin)")
    render.add_argument("--nodes", required=True, metavar="NODES.yaml", help="Node objects (kubectl get nodes -o yaml)")
    render.add_argument("--probe", metavar="PROBE.json", help="the runtime probe's JSON (default: assume cloneable, fast)")
    render.add_argument("--policy-file", metavar="FILE", help="operator policy YAML")
    render.add_argument("--namespace", default="default", help="namespace when the resource names none (default: default)")
    render.add_argument("--with-probe-job", action="store_true", help="also print the probe Job")
    render.set_defaults(func=cmd_render)

    crd_cmd = sub.add_parser("crd", help="print the CustomResourceDefinition")
    crd_cmd.set_defaults(func=lambda _args: _print(crd.crd_yaml()))

    reference_cmd = sub.add_parser("crd-reference", help="print the CRD reference (Markdown, docs/crd-reference.md)")
    reference_cmd.set_defaults(func=lambda _args: _print(reference.crd_reference_markdown()))

    rbac_cmd = sub.add_parser("rbac", help="print the ClusterRole the operator needs")
    rbac_cmd.add_argument(
        "--leader-election", action="store_true", help="print the Role leader election needs in the operator's namespace instead"
    )
    rbac_cmd.set_defaults(
        func=lambda args: _print(rbac.leader_election_role_yaml() if args.leader_election else rbac.cluster_role_yaml())
    )

    schema = sub.add_parser("policy-schema", help="print the JSON schema of the policy file")
    schema.set_defaults(func=lambda _args: _print(json.dumps(OperatorPolicy.model_json_schema(), indent=2) + "\n"))
    return parser


def _print(text: str) -> int:
    sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "workers", 1) < 1:
        parser.error("--workers must be >= 1")
    if getattr(args, "urgent_workers", 0) < 0:
        parser.error("--urgent-workers must be >= 0")
    try:
        return int(args.func(args))
    except UsageError as e:
        print(f"mmprep-operator {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
