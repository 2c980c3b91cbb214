"""Server settings: grouped, typed, with the reasons for each default.

Precedence for worker counts and device: command-line flag, then environment (what the operator
writes into the Deployment, ``contract.PoolDecisionEnv``), then the runtime's own decision
(``sizing.decide_workers``). Nothing
here is read at import time; ``from_args`` takes the environment as an argument so tests pass
their own.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import shlex
import urllib.parse
from collections.abc import Iterable, Mapping

from mmprep_runtime import sizing
from mmprep_runtime.contract import (
    ENV_API_KEY,
    ENV_DEVICE,
    ENV_DRAIN_SECONDS,
    ENV_ENGINE_URLS,
    ENV_FAST_PATHS,
    ENV_FETCH_ALLOWED_NETWORKS,
    ENV_IO_WORKERS,
    ENV_NORMALIZED_PIXELS,
    ENV_PROCESSOR_WORKERS,
    ENV_RENDER_PATH,
    ENV_RENDER_PROCESSES,
    ENV_SHUTDOWN_TIMEOUT_SECONDS,
    ENV_VLLM_ARGS,
    ContractError,
    PoolDecisionEnv,
    parse_seconds,
)


class SettingsError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """Which processor to load and how; ``engine.loading`` loads it."""

    model: str
    revision: str | None = None
    trust_remote_code: bool = False
    backend: sizing.Backend = sizing.Backend.AUTO
    device: sizing.Device = sizing.Device.AUTO
    #: Bind the exact, GIL-light stand-ins of ``stand_ins`` (off: transformers' own steps only).
    fast_paths: bool = True


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask for. Every bound keeps memory bounded under any load."""

    #: 32 MiB: a few large base64 images. Bodies are held whole, so admission x this is the
    #: worst-case request memory.
    max_body_bytes: int = 32 * 1024 * 1024
    #: 40 Mpx (e.g. 8000x5000): above any camera image a VLM resizes anyway; a decoded RGB image
    #: of this size is 120 MB, and a 30000x30000 bomb is refused from its header.
    max_image_pixels: int = 40_000_000
    #: Images in one request; each may be up to max_image_pixels.
    max_images: int = 16
    #: All images of one request together (PNGs of one colour compress ~1000:1, so the body limit
    #: alone would let one request decode to gigabytes).
    max_request_pixels: int = 80_000_000
    #: Audio items in one request and their length (Whisper takes 30 s windows).
    max_audio_items: int = 4
    max_audio_seconds: float = 60.0
    #: Characters of text; tokenizing is linear, but unbounded text is unbounded memory.
    max_text_chars: int = 200_000


@dataclasses.dataclass(frozen=True)
class Load:
    """Backpressure and deadlines."""

    #: Requests admitted beyond the workers; None = 4 per processor worker, enough to keep workers
    #: busy while requests decode, small enough that a queued request is not stale when served.
    queue_size: int | None = None
    #: Seconds from arrival to answer before 504.
    deadline_s: float = 30.0
    #: Retry-After on 429, seconds.
    retry_after_s: int = 1
    #: On SIGTERM, seconds of serving while not ready before the listener closes (``server.drain``).
    #: 0 by hand: nothing routes to a process run by hand, so there is nothing to wait for; the
    #: operator sets it (``contract.DrainEnv``) to the time endpoint removal takes to propagate.
    drain_s: float = 0.0
    #: Then, how long in-flight requests may take to finish; about the deadline, so a request
    #: admitted at the end of the window can still be answered.
    shutdown_grace_s: float = 25.0


@dataclasses.dataclass(frozen=True)
class FetchSettings:
    """How far an image URL may reach and how long it may take."""

    #: 20 MiB: larger than any photo a VLM needs; the decoded-pixel cap still applies after.
    max_bytes: int = 20 * 1024 * 1024
    #: Seconds to connect; a host that does not answer fails fast instead of holding a request slot.
    connect_timeout_s: float = 5.0
    #: Seconds between reads and for the whole body: a slow-drip server cannot hold a slot longer.
    read_timeout_s: float = 10.0
    #: Redirects followed; more is a loop or a trick.
    max_redirects: int = 3
    #: Networks that may be fetched although they are not public (e.g. an in-cluster image store).
    allowed_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()


@dataclasses.dataclass(frozen=True)
class RenderSettings:
    """The vLLM render API (``render``)."""

    #: Normalized pixel values in the model's dtype instead of uint8, as vLLM's
    #: ``--no-mm-device-do-normalize``. Off: the processor leaves rescale/normalize to the GPU where
    #: it can (vLLM's default), and the pixels travel as uint8 (4x smaller, less CPU).
    normalized_pixels: bool = False
    #: The name ``/v1/models`` answers and ``model`` must match (vLLM's ``--served-model-name``);
    #: None = the model as given, as vLLM does.
    served_model_name: str | None = None
    #: The context length prompts are checked against (vLLM's ``--max-model-len``); None = the
    #: model config's ``max_position_embeddings``, as vLLM does.
    max_model_len: int | None = None
    fetch: FetchSettings = FetchSettings()
    #: Which path renders (``choice``): ``auto`` (the native fast path for the families it
    #: renders byte-equal, vLLM's own processing for every other), ``native`` or ``general``.
    path: str = "auto"
    #: vLLM render processes of the general path; None = one per usable CPU.
    processes: int | None = None
    #: More options for vLLM's render processes, under vLLM's names (``--limit-mm-per-prompt``,
    #: ``--allowed-local-media-path``, ``--mm-processor-cache-gb``, ...).
    vllm_args: tuple[str, ...] = ()
    #: The key vLLM's guarded paths ask for (vLLM's ``--api-key``, or its ``VLLM_API_KEY`` env);
    #: checked by this server's front, for both paths. Never printed.
    api_key: str | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """The vLLM engines behind the OpenAI front (``apis.openai``): none, no front."""

    #: Base URLs of engines run with ``vllm serve MODEL --enable-scale-out`` (``http://host:port``).
    urls: tuple[str, ...] = ()
    #: Seconds to connect to an engine: one that does not answer is skipped after this (or, when it
    #: is the last, the request is a 503), instead of holding the client.
    connect_timeout_s: float = 3.0
    #: Seconds one generation may take from request to its last token; a longer one is cut off.
    timeout_s: float = 600.0
    #: Seconds between the background checks of each engine's ``/health``.
    health_interval_s: float = 5.0
    #: Requests the front carries at once (each holds a render slot only while it renders): a
    #: bound on memory and on what one pod asks of its engines; 429 beyond.
    max_in_flight: int = 1024


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    model: ModelSettings
    host: str = "0.0.0.0"
    port: int = 8080
    #: Explicit counts (flag or env); None lets the runtime decide.
    processor_workers: int | None = None
    io_workers: int | None = None
    #: The pool's decision when the operator started this pod (its env), reported by /v1/info.
    operator_decision: PoolDecisionEnv | None = None
    #: torch intra-op threads per worker; None = usable CPUs // processor workers.
    intra_op_threads: int | None = None
    limits: Limits = Limits()
    load: Load = Load()
    render: RenderSettings = RenderSettings()
    engines: EngineSettings = EngineSettings()


def _env_count(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        return sizing.parse_worker_count(name, text)
    except sizing.WorkerCountError as exc:
        raise SettingsError(str(exc)) from None


def _operator_decision(environ: Mapping[str, str]) -> PoolDecisionEnv | None:
    try:
        return PoolDecisionEnv.from_environ(environ)
    except ContractError as exc:
        raise SettingsError(str(exc)) from None


def _env_device(environ: Mapping[str, str]) -> sizing.Device | None:
    text = environ.get(ENV_DEVICE, "").strip().lower()
    if not text:
        return None
    try:
        return sizing.Device(text)
    except ValueError:
        raise SettingsError(f"{ENV_DEVICE} must be one of auto, cpu, cuda; got {text!r}") from None


def _seconds(flag: float | None, flag_name: str, environ: Mapping[str, str], env_name: str, *, allow_zero: bool) -> float | None:
    """A duration: the flag, else the env, else None (the default); ContractError -> SettingsError."""
    try:
        if flag is not None:
            return parse_seconds(flag_name, str(flag), allow_zero=allow_zero)
        text = environ.get(env_name, "").strip()
        return parse_seconds(env_name, text, allow_zero=allow_zero) if text else None
    except ContractError as exc:
        raise SettingsError(str(exc)) from None


def _env_switch(environ: Mapping[str, str], name: str) -> bool | None:
    text = environ.get(name, "").strip().lower()
    if not text:
        return None
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise SettingsError(f"{name} must be one of 1, true, on, yes, 0, false, off, no; got {text!r}")


def model_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> ModelSettings:
    device = sizing.Device(args.device) if args.device else (_env_device(environ) or sizing.Device.AUTO)
    fast_paths = args.fast_paths if args.fast_paths is not None else _env_switch(environ, ENV_FAST_PATHS)
    return ModelSettings(
        model=args.model,
        revision=args.revision,
        trust_remote_code=bool(args.trust_remote_code),
        backend=sizing.Backend(args.backend) if args.backend else sizing.Backend.AUTO,
        device=device,
        fast_paths=True if fast_paths is None else fast_paths,
    )


def serve_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> ServeSettings:
    limits = Limits()
    load = Load()
    overrides_limits = {
        "max_body_bytes": args.max_body_bytes,
        "max_image_pixels": args.max_image_pixels,
        "max_images": args.max_images,
    }
    for key, value in overrides_limits.items():
        if value is not None and value < 1:
            raise SettingsError(f"--{key.replace('_', '-')} must be positive, got {value}")
    limits = dataclasses.replace(limits, **{k: v for k, v in overrides_limits.items() if v is not None})
    if args.queue_size is not None and args.queue_size < 0:
        raise SettingsError(f"--queue-size must be >= 0, got {args.queue_size}")
    if args.deadline is not None and args.deadline <= 0:
        raise SettingsError(f"--deadline must be positive, got {args.deadline}")
    drain = _seconds(getattr(args, "drain_seconds", None), "--drain-seconds", environ, ENV_DRAIN_SECONDS, allow_zero=True)
    shutdown = _seconds(
        getattr(args, "shutdown_timeout", None), "--shutdown-timeout", environ, ENV_SHUTDOWN_TIMEOUT_SECONDS, allow_zero=False
    )
    load = dataclasses.replace(
        load,
        queue_size=args.queue_size if args.queue_size is not None else load.queue_size,
        deadline_s=args.deadline if args.deadline is not None else load.deadline_s,
        drain_s=drain if drain is not None else load.drain_s,
        shutdown_grace_s=shutdown if shutdown is not None else load.shutdown_grace_s,
    )
    return ServeSettings(
        model=model_settings_from_args(args, environ),
        render=render_settings_from_args(args, environ),
        engines=engine_settings_from_args(args, environ),
        host=args.host,
        port=args.port,
        processor_workers=args.processor_workers
        if args.processor_workers is not None
        else _env_count(environ, ENV_PROCESSOR_WORKERS),
        io_workers=args.io_workers if args.io_workers is not None else _env_count(environ, ENV_IO_WORKERS),
        operator_decision=_operator_decision(environ),
        intra_op_threads=args.intra_op_threads,
        limits=limits,
        load=load,
    )


def engine_url(text: str) -> str:
    """An engine's base URL, checked: http(s), a host, no query; the trailing slash dropped."""
    parsed = urllib.parse.urlsplit(text.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query or parsed.fragment:
        raise SettingsError(f"an engine is a base URL such as http://vllm-engine:8000, not {text!r}")
    try:
        parsed.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise SettingsError(f"an engine URL's port is not a port number: {text!r}") from None
    return urllib.parse.urlunsplit(parsed).rstrip("/")


def engine_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> EngineSettings:
    given = getattr(args, "engine", None) or environ.get(ENV_ENGINE_URLS, "").split()
    urls = tuple(dict.fromkeys(engine_url(text) for text in given))
    settings = EngineSettings(urls=urls)
    timeout = getattr(args, "engine_timeout", None)
    if timeout is not None:
        if timeout <= 0:
            raise SettingsError(f"--engine-timeout must be positive, got {timeout}")
        settings = dataclasses.replace(settings, timeout_s=timeout)
    return settings


def parse_networks(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``"10.0.0.0/8, 127.0.0.1"`` -> networks; raises SettingsError naming the bad item."""
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise SettingsError(f"not an IP network: {item!r}") from None
    return tuple(networks)


def vllm_option_names(vllm_args: Iterable[str]) -> frozenset[str]:
    """The options ``vllm_args`` gives, by name (``--name value`` and ``--name=value`` alike)."""
    return frozenset(arg.split("=", 1)[0] for arg in vllm_args if arg.startswith("--"))


def render_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> RenderSettings:
    normalized = getattr(args, "normalized_pixels", None)
    if normalized is None:
        normalized = _env_switch(environ, ENV_NORMALIZED_PIXELS) or False
    networks_text = getattr(args, "fetch_allowed_networks", None)
    if networks_text is None:
        networks_text = environ.get(ENV_FETCH_ALLOWED_NETWORKS, "")
    fetch = FetchSettings(allowed_networks=parse_networks(networks_text))
    max_bytes = getattr(args, "fetch_max_bytes", None)
    if max_bytes is not None:
        if max_bytes < 1:
            raise SettingsError(f"--fetch-max-bytes must be positive, got {max_bytes}")
        fetch = dataclasses.replace(fetch, max_bytes=max_bytes)
    timeout = getattr(args, "fetch_timeout", None)
    if timeout is not None:
        if timeout <= 0:
            raise SettingsError(f"--fetch-timeout must be positive, got {timeout}")
        fetch = dataclasses.replace(fetch, read_timeout_s=timeout)
    max_model_len = getattr(args, "max_model_len", None)
    if max_model_len is not None and max_model_len < 1:
        raise SettingsError(f"--max-model-len must be positive, got {max_model_len}")
    path = getattr(args, "render_path", None) or environ.get(ENV_RENDER_PATH, "").strip() or "auto"
    if path not in sizing.RENDER_PATHS:
        raise SettingsError(f"--render-path must be one of {', '.join(sizing.RENDER_PATHS)}, got {path!r}")
    processes = getattr(args, "render_processes", None)
    if processes is None:
        processes = _env_count(environ, ENV_RENDER_PROCESSES)
    elif processes < 1:
        raise SettingsError(f"--render-processes must be positive, got {processes}")
    vllm_text = getattr(args, "vllm_args", None)
    if vllm_text is None:
        vllm_text = environ.get(ENV_VLLM_ARGS, "")
    try:
        vllm_args = tuple(shlex.split(vllm_text))
    except ValueError as exc:
        raise SettingsError(f"--vllm-args cannot be split into options: {exc}") from None
    if "--api-key" in vllm_option_names(vllm_args):
        # The front answers every guarded path, the native path's too: the key must be its own.
        raise SettingsError("give the API key as --api-key (or env VLLM_API_KEY), not in --vllm-args")
    api_key = getattr(args, "api_key", None) or environ.get(ENV_API_KEY) or None
    return RenderSettings(
        normalized_pixels=normalized,
        served_model_name=getattr(args, "served_model_name", None),
        max_model_len=max_model_len,
        fetch=fetch,
        path=path,
        processes=processes,
        vllm_args=vllm_args,
        api_key=api_key,
    )
