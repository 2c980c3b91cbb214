"""Both images, built and run for real on a Docker engine.

Built by hack/docker/build-images.sh (the same script as `make images`; cached, so this is quick
after the first time). Skipped, with the reason, only where no Docker engine can be started.
The runtime containers are the ones `mmprep-operator render` produces (command, args, env, user,
read-only root filesystem, dropped capabilities, emptyDir /tmp, the models volume), run by Docker
the way a kubelet would: image and operator are tested together, not each against a guess.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from support.kube import wait_for
from support.packaging_support import (
    DOCKER_HACK,
    OPERATOR_IMAGE,
    REPO,
    RUNTIME_IMAGE,
    docker,
    image_config,
    image_size_mb,
    require_docker,
    venv_script,
)
from support.servers import free_port

# The first test pays for building the images in its setup: minutes on a new machine (debootstrap,
# 2.9 GB of wheels, the runtime's 6 GB of layers), seconds once cached.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]

RESTRICTED = ["--read-only", "--tmpfs", "/tmp:rw,size=512m", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
RUNTIME_UID = "65532"


@pytest.fixture(scope="module")
def images() -> dict[str, int]:
    """Both images, built (or found current in the build cache); their sizes in MB."""
    require_docker()
    done = subprocess.run([str(DOCKER_HACK / "build-images.sh")], capture_output=True, text=True, timeout=3600, check=False)
    assert done.returncode == 0, f"hack/docker/build-images.sh failed:\n{done.stderr[-5000:]}"
    sizes = {image: image_size_mb(image) for image in (OPERATOR_IMAGE, RUNTIME_IMAGE)}
    print(f"\nimage sizes: {sizes}")  # shown with -s / -rA; also in docs/development.md
    return sizes


def _readable_copy(source: Path, dest: Path) -> Path:
    """A copy the container's user can read (pytest's temp folders are private to root)."""
    shutil.copytree(source, dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


@pytest.fixture
def container() -> Iterator[Callable[..., str]]:
    """Start detached containers; each is removed afterwards (its logs are shown on failure)."""
    started: list[str] = []

    def run(*args: str) -> str:
        cid = docker("run", "-d", *args).stdout.strip()
        started.append(cid)
        return cid

    yield run
    for cid in started:
        docker("rm", "-f", cid, check=False)


def _logs(cid: str) -> str:
    done = docker("logs", "--tail", "80", cid, check=False)
    return done.stdout + done.stderr


def _png(width: int = 64, height: int = 48) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_images_run_as_non_root_and_the_operator_image_has_no_torch(images: dict[str, int]) -> None:
    for image in (OPERATOR_IMAGE, RUNTIME_IMAGE):
        assert image_config(image)["User"] == f"{RUNTIME_UID}:{RUNTIME_UID}"
    # No installer or compiler in the final images; the operator's has no torch.
    probe = (
        "import importlib.util as u, shutil; "
        "print(u.find_spec('torch') is not None, u.find_spec('pip') is not None, shutil.which('gcc'))"
    )
    out = docker("run", "--rm", *RESTRICTED, "--entrypoint", "/opt/venv/bin/python", OPERATOR_IMAGE, "-c", probe).stdout.split()
    assert out == ["False", "False", "None"], out
    out = docker("run", "--rm", *RESTRICTED, "--entrypoint", "/opt/venv/bin/python", RUNTIME_IMAGE, "-c", probe).stdout.split()
    assert out == ["True", "False", "None"], out
    version = docker("run", "--rm", *RESTRICTED, OPERATOR_IMAGE, "--version").stdout
    assert "0." in version or "1." in version, version
    assert images[OPERATOR_IMAGE] < images[RUNTIME_IMAGE]


def test_operator_image_also_builds_online_with_the_ca_bundle_as_a_build_secret(images: dict[str, int]) -> None:
    """The online path (no wheelhouse: pip reaches PyPI inside the build, trusting the CA bundle
    handed in as the `pip-cert` secret). The operator target only: the runtime's wheels are GBs."""
    import os

    tag = f"online-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "MMPREP_WHEELHOUSE": "0", "IMAGE_TAG": tag}
    done = subprocess.run(
        [str(DOCKER_HACK / "build-images.sh"), "operator"], env=env, capture_output=True, text=True, timeout=1200, check=False
    )
    try:
        assert done.returncode == 0, done.stderr[-4000:]
        image = f"mmprep-operator:{tag}"
        assert "mmprep-operator" in docker("run", "--rm", *RESTRICTED, image, "--version").stdout
    finally:
        docker("rmi", f"mmprep-operator:{tag}", check=False)


def _rendered_pod(spec: dict, kind: str, tmp_path: Path) -> dict:
    """The pod spec of the Deployment or probe Job `mmprep-operator render` makes for ``spec``."""
    cr = {"apiVersion": "mmprep.dev/v1alpha1", "kind": "MultimodalPreprocessor", "metadata": {"name": "docker"}, "spec": spec}
    cr_file = tmp_path / "cr.yaml"
    cr_file.write_text(yaml.safe_dump(cr))
    nodes = REPO / "hack" / "nodes.yaml"
    done = subprocess.run(
        [venv_script("mmprep-operator"), "render", "-f", str(cr_file), "--nodes", str(nodes), "--with-probe-job"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (obj,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == kind]
    return dict(obj["spec"]["template"]["spec"])


def _docker_args(pod: dict, host_paths: dict[str, Path], *, image: str = RUNTIME_IMAGE, namespace: str = "default") -> list[str]:
    """`docker run` arguments that run the pod's container as a kubelet would: its command, args
    and env, its user, read-only root, dropped capabilities, emptyDirs as tmpfs, the named volumes
    from ``host_paths``. Anything this does not understand fails the test (no silent drift)."""
    (c,) = pod["containers"]
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    args = ["--user", f"{psc['runAsUser']}:{psc.get('runAsGroup', psc['runAsUser'])}"]
    if csc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    if "ALL" in csc.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", "ALL"]
    if csc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        volume = volumes[m["name"]]
        if volume.get("emptyDir") is not None:
            args += ["--tmpfs", f"{m['mountPath']}:rw,size=512m,mode=1777"]
        else:
            args += ["-v", f"{host_paths[m['name']]}:{m['mountPath']}:ro"]
    for e in c.get("env", []):
        if "value" in e:
            args += ["-e", f"{e['name']}={e['value']}"]
        else:
            # The downward API fields the chart uses: the pod's namespace and name.
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            assert field in ("metadata.namespace", "metadata.name"), f"env {e['name']}: {e}"
            args += ["-e", f"{e['name']}={namespace if field == 'metadata.namespace' else 'pod-run-by-docker'}"]
    if c.get("command"):
        return [*args, "--entrypoint", c["command"][0], image, *c["command"][1:], *c.get("args", [])]
    return [*args, image, *c.get("args", [])]  # the image's ENTRYPOINT, as in the chart


def _models(model_dir: Callable[..., Path], tmp_path: Path, *kinds: str) -> Path:
    """A folder laid out like the examples' model volume (/models/<kind>), readable by the pod's user."""
    root = tmp_path / "models"
    root.mkdir()
    for kind in kinds:
        _readable_copy(model_dir(kind), root / kind)
    root.chmod(0o755)
    return root


def test_runtime_image_runs_the_deployment_the_operator_renders_and_serves(
    images: dict[str, int], container: Callable[..., str], model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """The container of a rendered runtime Deployment (examples/cpu-pool.yaml), run by Docker the
    way a kubelet would run it: non-root, read-only root filesystem, only /tmp writable."""
    spec = yaml.safe_load((REPO / "examples" / "cpu-pool.yaml").read_text())["spec"]
    pod = _rendered_pod(spec, "Deployment", tmp_path)
    (rendered,) = pod["containers"]
    port = rendered["ports"][0]["containerPort"]
    models = _models(model_dir, tmp_path, "qwen2-vl")
    cid = container("-p", f"127.0.0.1::{port}", *_docker_args(pod, {"models": models}))
    base = f"http://{docker('port', cid, f'{port}/tcp').stdout.split()[0]}"
    readiness = rendered["readinessProbe"]["httpGet"]["path"]

    def ready() -> bool:
        state = json.loads(docker("inspect", cid).stdout)[0]["State"]
        assert state["Running"], f"the runtime container exited:\n{_logs(cid)}"
        try:
            with urllib.request.urlopen(f"{base}{readiness}", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    wait_for(ready, 180, what=f"the runtime container's {readiness}", describe=lambda: _logs(cid))
    status, answer = _post(f"{base}/v1/preprocess", json.dumps({"text": "describe <|image_pad|>", "images": [_png()]}).encode())
    assert status == 200, answer
    assert answer["input_ids"] and answer["tensors"]["pixel_values"]["dtype"] == "float32"
    assert len(answer["tensors"]["pixel_values"]["shape"]) == 2
    # Bad input: a 4xx with a JSON error, and the pool keeps serving.
    status, error = _post(f"{base}/v1/preprocess", json.dumps({"text": "x", "images": ["not base64 at all!"]}).encode())
    assert 400 <= status < 500, (status, error)
    status, _ = _post(f"{base}/v1/preprocess", json.dumps({"text": "again <|image_pad|>", "images": [_png(80, 60)]}).encode())
    assert status == 200
    # The decision the operator wrote into the env is the one the server runs with.
    env = {e["name"]: e["value"] for e in rendered["env"]}
    with urllib.request.urlopen(f"{base}/v1/info", timeout=10) as resp:
        info = json.loads(resp.read())
    assert info["workers"]["processor"] == int(env["MMPREP_PROCESSOR_WORKERS"])
    assert info["workers"]["io"] == int(env["MMPREP_IO_WORKERS"])
    assert info["device"] == env["MMPREP_DEVICE"]
    # The metrics the chart's alerts are written against, from the real server.
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    for name in ("mmprep_worker_busy_seconds_total", "mmprep_processor_workers", "mmprep_queue_wait_seconds_bucket"):
        assert f"\n{name}" in metrics, f"{name} missing from /metrics"
    # The served-latency rule reads the ok class, which the request above landed in.
    assert re.search(r'\nmmprep_request_seconds_count\{outcome="ok"\} [1-9]', metrics), "no served request counted"
    assert docker("exec", cid, "id", "-u").stdout.strip() == RUNTIME_UID


@pytest.mark.parametrize(("kind", "cloneable"), [("qwen2-vl", True), ("uncloneable", False)])
def test_probe_job_the_operator_renders_writes_its_answer_to_the_termination_log(
    images: dict[str, int], model_dir: Callable[..., Path], tmp_path: Path, kind: str, cloneable: bool
) -> None:
    """The container of a rendered probe Job, with its terminationMessagePath as a host file."""
    spec = {
        "model": {"path": f"/models/{kind}", "trustRemoteCode": kind == "uncloneable"},
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "mmprep-models"}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }
    pod = _rendered_pod(spec, "Job", tmp_path)
    message_path = pod["containers"][0].get("terminationMessagePath", "/dev/termination-log")
    message = tmp_path / "termination-log"
    message.write_text("")
    message.chmod(0o666)
    done = docker(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{message}:{message_path}",
        *_docker_args(pod, {"models": _models(model_dir, tmp_path, kind)}),
    )
    stdout = json.loads(done.stdout)
    raw = message.read_bytes()
    assert len(raw) < 4096, "a termination message must stay under 4 KiB"
    written = json.loads(raw)
    assert written["cloneable"] is cloneable and stdout["cloneable"] is cloneable
    assert written["processor_class"] == stdout["processor_class"]
    if not cloneable:
        assert written["error"], "a processor that cannot be cloned says why"


def test_charts_operator_pod_run_from_the_image_reconciles_on_the_local_control_plane(
    images: dict[str, int],
    container: Callable[..., str],
    cluster,  # noqa: ANN001 - fixtures from tests/conftest.py
    crd: str,
    kube,  # noqa: ANN001
    private_namespace: str,
    model_dir: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """The operator Deployment the chart installed, its container run from the operator image as a
    kubelet would run it: in-cluster configuration from a projected ServiceAccount token (the
    chart's account, so exactly the chart's rights), the policy ConfigMap mounted, restricted
    security settings, host network standing in for the pod network. A full reconcile follows."""
    import base64

    import yaml as _yaml
    from support.chart_cluster import full_reconcile, installed_chart, wait_until_granted

    namespace = private_namespace  # watched by this container only
    health, metrics = free_port(), free_port()  # host network: the chart's default ports may be taken
    values = {
        "watchNamespaces": [namespace],
        "replicaCount": 0,  # this control plane runs no images; Docker runs the pod below
        "operator": {"livenessPort": health, "metricsPort": metrics, "logFormat": "text"},
    }
    with installed_chart(cluster, namespace, values) as release:
        deployment = kube.api.sanitize_for_serialization(kube.apps.read_namespaced_deployment(release.operator_name, namespace))
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == release.service_account

        # What the kubelet would mount: the policy ConfigMap, and the projected token with the CA.
        policy = tmp_path / "policy"
        policy.mkdir()
        (policy / "policy.yaml").write_text(release.policy_text(kube))
        account = tmp_path / "serviceaccount"
        account.mkdir()
        sa_kubeconfig = release.token_kubeconfig(kube, tmp_path / "sa.kubeconfig")
        wait_until_granted(sa_kubeconfig, namespace)
        sa_config = _yaml.safe_load(sa_kubeconfig.read_text())
        (account / "token").write_text(sa_config["users"][0]["user"]["token"])
        (account / "ca.crt").write_bytes(base64.b64decode(sa_config["clusters"][0]["cluster"]["certificate-authority-data"]))
        (account / "namespace").write_text(namespace)
        for d in (policy, account):
            for f in [d, *d.iterdir()]:
                f.chmod(0o755 if f.is_dir() else 0o644)
        server = sa_config["clusters"][0]["cluster"]["server"].removeprefix("https://")
        host, _, port = server.rpartition(":")
        cid = container(
            "--network", "host",
            "-e", f"KUBERNETES_SERVICE_HOST={host}", "-e", f"KUBERNETES_SERVICE_PORT={port}",
            "-v", f"{account}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
            *_docker_args(pod, {"policy": policy}, image=OPERATOR_IMAGE, namespace=namespace),
        )  # fmt: skip
        probe = pod["containers"][0]["livenessProbe"]["httpGet"]
        assert probe["port"] in {p["name"] for p in pod["containers"][0]["ports"]}

        def healthy() -> bool:
            state = json.loads(docker("inspect", cid).stdout)[0]["State"]
            assert state["Running"], f"the operator container exited:\n{_logs(cid)}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}{probe['path']}", timeout=3) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_for(healthy, 60, what="the operator container's liveness endpoint", describe=lambda: _logs(cid))
        full_reconcile(kube, namespace, model_dir("qwen2-vl"), name=f"image-{uuid.uuid4().hex[:4]}")
        logs = _logs(cid)
        assert "probe job created" in logs and namespace in logs, logs
        assert "Forbidden" not in logs, logs
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as resp:
            assert b"mmprep" in resp.read()
