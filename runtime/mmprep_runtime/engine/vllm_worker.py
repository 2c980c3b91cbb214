"""One worker process of the general render path: vLLM's own render server, on a Unix socket.

``python -m mmprep_runtime.engine.vllm_worker --socket PATH -- MODEL [vLLM's options]``

The process builds what ``vllm launch render`` builds (vLLM's argument parser and checks, its
``VllmConfig`` with quantization cleared, its FastAPI app and render state: chat template,
renderer, multimodal processor, kwargs encoding) and serves it with uvicorn on ``PATH`` instead
of a TCP port. Every answer, error answers included, is therefore vLLM's own, computed by the
installed vLLM's code: the general path is correct by construction and follows vLLM's version.

Why processes and not threads: vLLM runs a model's multimodal processing on one thread fixed in
its code, and that processing holds the GIL for most of its time (``vllm_pool`` measures the
share). Threads inside one such process cannot add throughput; processes can, one core each.
``vllm_pool`` starts, watches and leases these processes; ``apis.vllm_general`` forwards requests.

vLLM is imported only here (and in ``vllm_pool.vllm_version``): the rest of the runtime runs
without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from typing import Any


def _vllm_args(argv: list[str]) -> argparse.Namespace:
    """vLLM's own parser and checks, as ``vllm launch render`` applies them."""
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ModuleNotFoundError:  # vLLM 0.32 keeps them with its launchers
        from vllm.entrypoints.launchers.cli_args import (
            make_arg_parser,
            validate_parsed_serve_args,
        )
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="mmprep-runtime vllm worker"))
    args = parser.parse_args(argv)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    namespace: argparse.Namespace = args
    return namespace


async def _build_app(args: argparse.Namespace) -> Any:
    """The render server's app and state, built the way vLLM's render launcher builds them."""
    from vllm import AsyncEngineArgs, envs
    from vllm.config import VllmConfig
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state

    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    # As vLLM's launcher: rendering runs no kernels, so no quantization checks, and no KV cache.
    model_config.quantization = None
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    vllm_config = VllmConfig(
        model_config=model_config,
        logging_config=engine_args.create_logging_config(),
        structured_outputs_config=engine_args.create_structured_outputs_config(),
    )
    app = build_app(args, ("render",))
    await init_render_app_state(vllm_config, app.state, args)
    return app


async def _serve(socket_path: str, args: argparse.Namespace) -> None:
    import uvicorn

    app = await _build_app(args)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # a socket left by a worker that died: this one replaces it
    config = uvicorn.Config(app, uds=socket_path, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    # The parent owns the signals: SIGTERM reaches a worker only when the pool stops it.
    await server.serve()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m mmprep_runtime.engine.vllm_worker --socket PATH -- MODEL [vLLM options]", file=sys.stderr)
        return 2
    split = argv.index("--")
    ours = argparse.ArgumentParser(prog="mmprep-runtime vllm worker")
    ours.add_argument("--socket", required=True)
    mine = ours.parse_args(argv[:split])
    args = _vllm_args(argv[split + 1 :])
    try:
        import uvloop

        uvloop.run(_serve(mine.socket, args))
    except ImportError:
        asyncio.run(_serve(mine.socket, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
