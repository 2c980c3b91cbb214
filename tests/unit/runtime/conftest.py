"""Shared fixtures of the runtime unit tests: real processor folders, images, audio, and a server
on a real port with a client of the preprocess API (``start_server``).

Every folder is built once per session with ``mmprep_runtime.synthetic.models`` (real transformers
classes, a tokenizer trained with ``tokenizers``) and loaded the way a server loads a hub model.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import pathlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mmprep_runtime import cli
from mmprep_runtime.engine import core as engine
from mmprep_runtime.server import state as server_state
from mmprep_runtime.server.app import create_app
from mmprep_runtime.settings import Limits, Load, ModelSettings, ServeSettings, serve_settings_from_args
from mmprep_runtime.sizing import Backend, Device
from mmprep_runtime.synthetic import models


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    # Two shared cores: tests measure behaviour, not speed; intra-op threads would only contend.
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., pathlib.Path]:
    cache: dict[tuple[str, str, int | None], pathlib.Path] = {}

    def make(kind: str, *, backend: str = "torchvision", declared_workers: int | None = None) -> pathlib.Path:
        key = (kind, backend, declared_workers)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"model-{kind}-{backend}")
            cache[key] = models.make_model(kind, out, backend=backend, declared_workers=declared_workers)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def qwen_dir(model_factory: Callable[..., pathlib.Path]) -> pathlib.Path:
    return model_factory("qwen2-vl")


@pytest.fixture(scope="session")
def llava_dir(model_factory: Callable[..., pathlib.Path]) -> pathlib.Path:
    return model_factory("llava")


@pytest.fixture(scope="session")
def whisper_dir(model_factory: Callable[..., pathlib.Path]) -> pathlib.Path:
    return model_factory("whisper")


@pytest.fixture(scope="session")
def tokenizer_dir(model_factory: Callable[..., pathlib.Path]) -> pathlib.Path:
    return model_factory("tokenizer")


@pytest.fixture(scope="session")
def uncloneable_dir(model_factory: Callable[..., pathlib.Path]) -> pathlib.Path:
    return model_factory("uncloneable")


@pytest.fixture
def started():
    """Start real engines on the CPU (``started(folder, **start_engine kwargs)``); closed after the test."""
    engines: list[engine.Engine] = []

    def start(folder: pathlib.Path, **kwargs) -> engine.Engine:
        model = ModelSettings(
            str(folder),
            trust_remote_code=kwargs.pop("trust_remote_code", False),
            backend=kwargs.pop("backend", Backend.AUTO),
            device=Device.CPU,
        )
        engines.append(engine.start_engine(model, **kwargs))
        return engines[-1]

    yield start
    for running in engines:
        running.close(timeout=30)


#: The processor pool's worker threads are named with this prefix (``executor.ProcessorPool``).
POOL_THREAD_PREFIX = "mmprep-processor"


class _OriginalGuard:
    """Mixed into the original processor's class once the workers hold their clones: any pool job
    that reaches the original (a closure over it, a module-level processor) instead of the clone
    it was given fails loudly. The event loop and IO threads may still read it."""

    def __getattribute__(self, name: str):
        if threading.current_thread().name.startswith(POOL_THREAD_PREFIX):
            raise AssertionError(f"a pool job used the original processor ({name!r}) instead of its worker's clone")
        return object.__getattribute__(self, name)


def guard_original_processor(running: engine.Engine) -> None:
    """The test-time audit that every job the server submits takes the injected clone."""
    # Every live worker holds its clone already (the server warms them before it is ready).
    assert len(running.pool.clone_seconds) == running.pool.live_workers or not running.clone_trial.cloneable
    if not running.clone_trial.cloneable:
        return  # the single worker of an uncloneable processor uses the original by design
    original = running.pool._resolve()
    cls = type(original)
    original.__class__ = type(f"Guarded{cls.__name__}", (_OriginalGuard, cls), {})


SERVE_TIMEOUT = 60


@dataclasses.dataclass
class Served:
    """The real HTTP app on a free local port, and a client session to it."""

    url: str
    app: web.Application
    client: aiohttp.ClientSession

    @property
    def state(self) -> server_state.ServerState:
        return self.app[server_state.STATE]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[ServeSettings], Awaitable[Served]]]:
    """``await serve(settings)``: the app as ``serve`` runs it, loaded (or failed) before it returns,
    with every pool job guarded against the original processor; stopped after the test."""
    runners: list[web.AppRunner] = []
    clients: list[aiohttp.ClientSession] = []

    async def start(settings: ServeSettings) -> Served:
        app = create_app(settings)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5, handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SERVE_TIMEOUT))
        clients.append(client)
        await asyncio.wait_for(app[server_state.STATE].settled.wait(), SERVE_TIMEOUT)
        if app[server_state.STATE].engine is not None:
            guard_original_processor(app[server_state.STATE].engine)
        return Served(f"http://{host}:{port}", app, client)

    yield start
    for client in clients:
        await client.close()
    for runner in runners:
        await runner.cleanup()


# ---- a server on a real port, and a client of mmprep's preprocess API (the HTTP tests)

TIMEOUT = 60
QWEN_TEXT = f"Describe {models.QWEN_IMAGE_PLACEHOLDER} please"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Running(Served):
    async def post(self, payload: Any = None, *, data: bytes | None = None, headers=None, query: str = ""):
        if data is None:
            data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        async with self.client.post(f"{self.url}/v1/preprocess{query}", data=data, headers=headers) as response:
            body = await response.read()
            return response.status, dict(response.headers), body

    async def json(self, path: str) -> tuple[int, Any]:
        async with self.client.get(f"{self.url}{path}") as response:
            return response.status, await response.json()


Starter = Callable[..., Awaitable[Running]]


def serve_args(folder) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", "--model", str(folder)])


@pytest.fixture
def start_server(serve: Callable[[ServeSettings], Awaitable[Served]]) -> Starter:
    async def start(
        folder,
        *,
        workers: int | None = 1,
        limits: Limits = Limits(),
        load: Load = Load(),
        trust_remote_code: bool = False,
        backend: Backend = Backend.AUTO,
        environ: dict[str, str] | None = None,
    ) -> Running:
        """``environ``: the pod's env as the operator renders it; it replaces ``workers``."""
        decided = serve_settings_from_args(serve_args(folder), environ) if environ is not None else None
        if decided is not None:
            workers = decided.processor_workers
        settings = ServeSettings(
            model=ModelSettings(str(folder), trust_remote_code=trust_remote_code, backend=backend, device=Device.CPU),
            host="127.0.0.1",
            port=0,
            processor_workers=workers,
            io_workers=2,
            limits=limits,
            load=load,
            operator_decision=decided.operator_decision if decided is not None else None,
        )
        served = await serve(settings)
        return Running(served.url, served.app, served.client)

    return start
