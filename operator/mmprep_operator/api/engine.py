"""``spec.engine``: the vLLM engine behind the pool's OpenAI front.

With it, each runtime pod also answers OpenAI's ``/v1/chat/completions`` and ``/v1/completions``:
it renders the request in-process, sends the render to the engine's ``POST
{url}/inference/v1/generate`` and derenders the answer (``mmprep-runtime serve --engine URL``,
which ``logic.manifests`` writes). The engine is named once, either as a URL or as a Service in
the resource's own namespace; ``Engine.base_url`` is the one place that turns either into the URL
the pods are given and the operator checks (``control.engine_checker``: ``GET {url}/health``).
"""

from __future__ import annotations

from typing import Final

from pydantic import Field, model_validator

from mmprep_operator.api.base import ApiModel, CelRule, cel_rules

_ONE_ENGINE: Final = CelRule("has(self.url) != has(self.service)", "set exactly one of engine.url and engine.service")

#: An http(s) base URL: scheme, host (a name, an IPv4 address or a bracketed IPv6 one), optional
#: port, and at most a trailing slash. The runtime appends the engine's paths itself.
URL_PATTERN: Final = r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:[0-9]{1,5})?/?$"
#: A Service's name: a DNS-1035 label, as the API server requires of Services.
SERVICE_NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class EngineService(ApiModel):
    """A Service in the resource's own namespace in front of the engine's replicas."""

    name: str = Field(min_length=1, max_length=63, pattern=SERVICE_NAME_PATTERN, description="The Service's name.")
    port: int = Field(ge=1, le=65535, description="The Service port the engine's HTTP API is on (vLLM's default: 8000).")


class Engine(ApiModel):
    """The vLLM engine the pods send their renders to: exactly one of url and service. Several
    engine replicas go behind one Service, which balances them."""

    model_config = cel_rules(_ONE_ENGINE)

    url: str | None = Field(
        None,
        min_length=8,
        max_length=512,
        pattern=URL_PATTERN,
        description="The engine's base URL, e.g. http://vllm-engine.serving.svc:8000 (no path; the pods add "
        "/inference/v1/generate, the operator's check /health).",
    )
    service: EngineService | None = Field(
        None,
        description="A Service in the resource's namespace in front of the engine's replicas; the URL becomes "
        "http://<name>.<namespace>.svc:<port>.",
    )

    @model_validator(mode="after")
    def _one_engine(self) -> Engine:
        if (self.url is None) == (self.service is None):
            raise ValueError(_ONE_ENGINE.message)
        return self

    def base_url(self, namespace: str) -> str:
        """The engine's base URL, without a trailing slash, for a resource in ``namespace``."""
        if self.service is not None:
            return f"http://{self.service.name}.{namespace}.svc:{self.service.port}"
        assert self.url is not None  # one of the two: the validator says so
        return self.url.rstrip("/")
