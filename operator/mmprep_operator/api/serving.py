"""``spec.serving``: the runtime's request limits and the names it answers to.

Each field is one ``mmprep-runtime serve`` flag (``logic.manifests`` writes them, only those set);
unset, the runtime's own default holds, and the description quotes it from the runtime's settings
so that the two cannot drift apart silently.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Final, Literal

from pydantic import Field, model_validator

from mmprep_operator.api.base import ApiModel, CelRule, cel_rules
from mmprep_runtime.settings import Limits, Load

_LIMITS: Final = Limits()
_LOAD: Final = Load()

_NETWORKS: Final = CelRule(
    # Kubernetes' CEL IP/CIDR library (API servers >= 1.31).
    "!has(self.fetchAllowedNetworks) || self.fetchAllowedNetworks.all(n, isCIDR(n) || isIP(n))",
    "serving.fetchAllowedNetworks must hold IP networks (CIDR, e.g. 10.0.0.0/8) or addresses",
)

#: An IPv4 or IPv6 network (CIDR) or address; the runtime's --fetch-allowed-networks items.
Network = Annotated[str, Field(min_length=2, max_length=49, pattern=r"^[0-9a-fA-F:.]+(/[0-9]{1,3})?$")]


class ServingSpec(ApiModel):
    """The runtime's limits and names. Unset fields keep the runtime's defaults."""

    model_config = cel_rules(_NETWORKS)

    served_model_name: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="vllm-render: the model name /v1/models answers and requests must name (vLLM's "
        "--served-model-name); default the model as given (model.path or model.id).",
    )
    max_model_len: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="vllm-render: the context length prompts are checked against (vLLM's --max-model-len); "
        "default the model config's max_position_embeddings.",
    )
    request_deadline_seconds: float | None = Field(
        None,
        # ge, not gt: a CRD's exclusiveMinimum is a flag (OpenAPI 3.0), not JSON Schema's number.
        ge=0.01,
        le=3600,
        description=f"Seconds from a request's arrival to its answer before 504; default {_LOAD.deadline_s:g}.",
    )
    queue_size: int | None = Field(
        None,
        ge=0,
        le=100_000,
        description="Requests admitted beyond the busy workers before 429; default 4 per processor worker.",
    )
    max_images_per_request: int | None = Field(
        None, ge=1, le=1024, description=f"Images in one request; default {_LIMITS.max_images}."
    )
    max_body_bytes: int | None = Field(
        None,
        ge=1024,
        le=1 << 30,
        description=f"Largest request body accepted (413 above); default {_LIMITS.max_body_bytes} (32 MiB).",
    )
    fetch_allowed_networks: list[Network] | None = Field(
        None,
        max_length=64,
        description="Networks (CIDR) that image URLs may reach although they are not public, e.g. an in-cluster "
        "image store; default none (only public addresses are fetched).",
    )

    render_path: Literal["auto", "native", "general"] | None = Field(
        None,
        description="vllm-render: which path renders. auto (the default): mmprep's native fast path for Qwen2-VL, Qwen2.5-VL, "
        "Qwen3-VL, GLM-4.1V, Gemma 3, Mistral 3, LLaVA-OneVision, InternVL, Idefics3 and Qwen2-Audio, vLLM's own processing "
        "in worker processes for every other model and for what the fast path does not render (video, other audio, tools); "
        "native; or general "
        "(always vLLM's own). Every path but native needs the vLLM image (the operator policy's vllmRenderImage, "
        "or spec.image).",
    )
    render_processes: int | None = Field(
        None,
        ge=1,
        le=256,
        description="vllm-render: vLLM render processes of the general path per pod; default the calibration's "
        "count when workers.calibrate is on, else one per usable CPU.",
    )
    vllm_args: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        None,
        max_length=64,
        description="vllm-render: more options for vLLM's render processes, one item per word, under vLLM's names, "
        'e.g. ["--limit-mm-per-prompt", "{\\"image\\":4,\\"video\\":1}", "--allowed-local-media-path", "/data"].',
    )

    @model_validator(mode="after")
    def _networks(self) -> ServingSpec:
        for item in self.fetch_allowed_networks or ():
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(_NETWORKS.message) from None
        return self
