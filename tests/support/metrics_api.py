"""A stand-in for metrics-server on the local control plane: the real ``v1beta1.metrics.k8s.io``
APIService, served by a small HTTPS server in the test process.

The API server's aggregator finds it through an ExternalName Service (``localhost``), checks it
(the APIService turns Available, which is what the operator's detection reads), and proxies the
real kube-controller-manager's HPA requests to it: pod metrics of the runtime container at the CPU
usage a test sets per namespace. So the HPA controller that scales the pools is the real one;
only the numbers it reads are the test's.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

GROUP_VERSION = "metrics.k8s.io/v1beta1"
API_SERVICE = "v1beta1.metrics.k8s.io"
SERVICE = ("kube-system", "mmprep-test-metrics")

#: (namespace, label selector) -> names of the pods it selects, with their containers.
PodLister = Callable[[str, str], list[tuple[str, list[str]]]]


class MetricsApi:
    def __init__(self, pods: PodLister, cert_dir: Path) -> None:
        self.pods = pods
        #: namespace -> CPU usage (millicores) every container reports there; absent: 0.
        self.cpu_millis: dict[str, int] = {}
        self.requests = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.socket = _tls(cert_dir).wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-api", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def objects(self) -> Iterator[dict[str, Any]]:
        """The Service and APIService that register this server with the aggregator."""
        namespace, name = SERVICE
        yield {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"port": self.port, "protocol": "TCP"}]},
        }
        yield {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": API_SERVICE},
            "spec": {
                "service": {"namespace": namespace, "name": name, "port": self.port},
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }

    def _pod_metrics(self, namespace: str, selector: str) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        millis = self.cpu_millis.get(namespace, 0)
        items = [
            {
                "metadata": {"name": pod, "namespace": namespace},
                "timestamp": now,
                # A short window: the HPA counts a just-ready pod's sample once its window has passed.
                "window": "1s",
                "containers": [{"name": c, "usage": {"cpu": f"{millis}m", "memory": "64Mi"}} for c in containers],
            }
            for pod, containers in self.pods(namespace, selector)
        ]
        return {"kind": "PodMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                pass

            def do_GET(self) -> None:
                api.requests += 1
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if url.path.rstrip("/") == f"/apis/{GROUP_VERSION}":
                    body: dict[str, Any] = {
                        "kind": "APIResourceList",
                        "apiVersion": "v1",
                        "groupVersion": GROUP_VERSION,
                        "resources": [
                            {"name": "pods", "namespaced": True, "kind": "PodMetrics", "verbs": ["get", "list"]},
                            {"name": "nodes", "namespaced": False, "kind": "NodeMetrics", "verbs": ["get", "list"]},
                        ],
                    }
                elif (
                    parts[:3] == ["apis", "metrics.k8s.io", "v1beta1"] and parts[3:4] == ["namespaces"] and parts[5:] == ["pods"]
                ):
                    selector = parse_qs(url.query).get("labelSelector", [""])[0]
                    body = api._pod_metrics(parts[4], selector)
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _tls(cert_dir: Path) -> ssl.SSLContext:
    cert, key = cert_dir / "metrics.crt", cert_dir / "metrics.key"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
