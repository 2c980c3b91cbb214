"""``mmprep-runtime``: the command line. Parses arguments and hands over to one module per command.

Each command module is imported only when its command runs, so ``--help`` and argument errors
answer without importing torch or transformers (seconds on a busy node).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from mmprep_runtime import exits, sizing, versions

EXIT_USAGE = exits.EXIT_USAGE


def _worker_count(text: str) -> int:
    try:
        return sizing.parse_worker_count("the count", text)
    except sizing.WorkerCountError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder or hub id of the processor")
    parser.add_argument("--revision", default=None, help="hub revision (ignored for folders)")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the processor's own Python code from the model folder (refused otherwise)",
    )
    parser.add_argument(
        "--backend",
        choices=[b.value for b in sizing.Backend],
        default=None,
        help="image processor backend (default auto: torchvision when available)",
    )
    parser.add_argument(
        "--device",
        choices=[d.value for d in sizing.Device],
        default=None,
        help="where a fast image processor runs (default: env MMPREP_DEVICE, else auto)",
    )
    parser.add_argument(
        "--no-fast-paths",
        dest="fast_paths",
        action="store_false",
        default=None,
        help="use transformers' own token checks instead of mmprep's exact, GIL-light "
        "stand-ins (default: env MMPREP_FAST_PATHS, else on)",
    )


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="serve POST /v1/preprocess over HTTP")
    _add_model_arguments(serve)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--processor-workers",
        type=_worker_count,
        default=None,
        help="processor worker threads (overrides env MMPREP_PROCESSOR_WORKERS)",
    )
    serve.add_argument("--io-workers", type=_worker_count, default=None, help="decode threads (overrides env MMPREP_IO_WORKERS)")
    serve.add_argument(
        "--intra-op-threads", type=_worker_count, default=None, help="torch threads per worker (default: usable CPUs / workers)"
    )
    serve.add_argument("--queue-size", type=int, default=None, help="requests waiting beyond the workers before 429")
    serve.add_argument("--deadline", type=float, default=None, help="per-request deadline in seconds (504 after)")
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=None,
        help="on SIGTERM, seconds to keep serving while not ready before the listener closes "
        "(default: env MMPREP_DRAIN_SECONDS, else 0)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=None,
        help="then, seconds in-flight requests may take to finish (default: env MMPREP_SHUTDOWN_TIMEOUT_SECONDS, else 25)",
    )
    serve.add_argument("--max-body-bytes", type=int, default=None, help="largest request body accepted (413 above)")
    serve.add_argument("--max-image-pixels", type=int, default=None, help="largest decoded image, in pixels")
    serve.add_argument("--max-images", type=int, default=None, help="most images in one request")
    serve.add_argument(
        "--normalized-pixels",
        action="store_true",
        default=None,
        help="vLLM render API: normalized pixel values in the model's dtype instead of uint8 "
        "(vLLM's --no-mm-device-do-normalize; default: env MMPREP_NORMALIZED_PIXELS, else off)",
    )
    serve.add_argument(
        "--render-path",
        choices=sizing.RENDER_PATHS,
        default=None,
        help="vLLM render API: auto (the native fast path for Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V, Gemma 3, "
        "Mistral 3, LLaVA-OneVision, InternVL, Idefics3 and Qwen2-Audio, vLLM's own processing in worker processes for every "
        "other model), native, "
        "or general (default: env MMPREP_RENDER_PATH, else auto)",
    )
    serve.add_argument(
        "--render-processes",
        type=int,
        default=None,
        help="vLLM render API: vLLM render processes of the general path (default: env MMPREP_RENDER_PROCESSES, "
        "else one per usable CPU)",
    )
    serve.add_argument(
        "--vllm-args",
        default=None,
        help="vLLM render API: more options for vLLM's render processes, as one string under vLLM's names, e.g. "
        "'--limit-mm-per-prompt {\"image\":4} --allowed-local-media-path /data' (default: env MMPREP_VLLM_ARGS)",
    )
    serve.add_argument(
        "--api-key",
        default=None,
        help="vLLM render API: the key the paths vLLM guards (/v1, /v2, /inference) ask for as 'Authorization: Bearer "
        "KEY', on both paths (default: env VLLM_API_KEY, else none)",
    )
    serve.add_argument(
        "--engine",
        action="append",
        default=None,
        metavar="URL",
        help="OpenAI API: a vLLM engine run with --enable-scale-out (its base URL, e.g. http://vllm:8000; give it once "
        "per engine): /v1/chat/completions and /v1/completions are rendered here, generated there and derendered "
        "here (default: env MMPREP_ENGINE_URLS, space-separated; none: no OpenAI API)",
    )
    serve.add_argument(
        "--engine-timeout",
        type=float,
        default=None,
        help="OpenAI API: seconds one generation may take, first byte to last token (default 600)",
    )
    serve.add_argument(
        "--served-model-name", default=None, help="vLLM render API: the model name /v1/models answers (default: --model as given)"
    )
    serve.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="vLLM render API: context length prompts are checked against (default: the model config's)",
    )
    serve.add_argument(
        "--fetch-allowed-networks",
        default=None,
        help="image URLs: comma-separated networks that may be fetched although not public "
        "(default: env MMPREP_FETCH_ALLOWED_NETWORKS, else none)",
    )
    serve.add_argument("--fetch-max-bytes", type=int, default=None, help="image URLs: largest body fetched")
    serve.add_argument(
        "--fetch-timeout", type=float, default=None, help="image URLs: seconds to read (connecting has its own 5 s)"
    )
    serve.add_argument("--log-level", default="INFO")
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="text, or one JSON object per line for log pipelines (default: env MMPREP_LOG_FORMAT, else text)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        default=None,
        help="log every answered request: method, path, status, time, request id "
        "(default: env MMPREP_ACCESS_LOG=1, else off: it costs throughput)",
    )
    serve.add_argument(
        "--termination-log", default=None, help="on a failed start, write the reason here (Kubernetes terminationMessagePath)"
    )


def _add_probe(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    probe = commands.add_parser("probe", help="print what this processor is and whether it can be cloned")
    _add_model_arguments(probe)
    probe.add_argument("--termination-log", default=None, help="also write the JSON here (Kubernetes terminationMessagePath)")


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = commands.add_parser("bench", help="throughput and latency by worker count")
    _add_model_arguments(bench)
    bench.add_argument("--workers", default="1,2,4", help="comma-separated worker counts to measure")
    bench.add_argument("--duration", type=float, default=10.0, help="seconds of load per worker count")
    bench.add_argument("--image", default="1280x960", help="synthetic image size WxH, one image per request")
    bench.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds the duration is split into (fair under changing load)"
    )
    bench.add_argument("--warmup", type=float, default=1.0, help="seconds of unmeasured load first")
    bench.add_argument(
        "--intra-op-threads",
        type=_worker_count,
        default=None,
        help="torch threads per worker (default: usable CPUs / workers, as serve does)",
    )
    bench.add_argument("--decode", action="store_true", help="decode the JPEG in every job (end-to-end CPU cost)")
    bench.add_argument(
        "--api",
        choices=["none", "preprocess", "vllm-render"],
        default="none",
        help="measure the served path of this HTTP API (Engine.serve: parse, decode, process, "
        "encode) instead of the processor call alone",
    )
    bench.add_argument("--json", dest="json_out", default=None, help="also write the JSON result to this file")
    bench.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def _add_calibrate(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    calibrate = commands.add_parser(
        "calibrate", help="measure worker (or render process) counts 1..N here and choose one (operator Jobs)"
    )
    _add_model_arguments(calibrate)
    calibrate.add_argument(
        "--max-workers",
        type=_worker_count,
        default=8,
        help="largest worker count to measure (also capped by the CPUs this process may use)",
    )
    calibrate.add_argument(
        "--image", default="1280x960", help="comma-separated synthetic image sizes WxH, rotated through (default 1280x960)"
    )
    calibrate.add_argument(
        "--samples", default=None, help="a folder of sample images (jpg/png/webp) to rotate through instead of synthetic ones"
    )
    calibrate.add_argument("--duration", type=float, default=12.0, help="seconds of load per worker count")
    calibrate.add_argument("--rounds", type=int, default=3, help="interleaved rounds the duration is split into")
    calibrate.add_argument("--warmup", type=float, default=1.0, help="seconds of unmeasured load per count first")
    calibrate.add_argument(
        "--tolerance", type=float, default=0.05, help="choose the fewest workers within this fraction of the best throughput"
    )
    calibrate.add_argument(
        "--render-path",
        choices=sizing.RENDER_PATHS,
        default=None,
        help="a pool serving the vLLM render API: measure the path serving the model under this setting (the "
        "general path's vLLM render processes, or the native path's workers); unset: processor workers",
    )
    calibrate.add_argument(
        "--vllm-args", default=None, help="with --render-path: more options for vLLM's render processes, as serve takes them"
    )
    calibrate.add_argument(
        "--termination-log", default=None, help="also write the JSON report here (Kubernetes terminationMessagePath)"
    )


def _add_make_model(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    make = commands.add_parser("make-model", help="build a real processor folder offline (tests, demos)")
    make.add_argument(
        "--kind",
        required=True,
        # The families are not listed here: naming them would import the builders on every start.
        help="qwen2-vl, llava, whisper, tokenizer, uncloneable, or a family of the compatibility suite "
        "(an unknown kind's error lists every kind)",
    )
    make.add_argument("--out", required=True, help="folder to create (must be empty or absent)")
    make.add_argument(
        "--backend", choices=["torchvision", "pil"], default="torchvision", help="image processor class written into the folder"
    )
    make.add_argument(
        "--declared-io-workers",
        type=_worker_count,
        default=None,
        help="write mmprep.json declaring this IO (decode) worker count",
    )
    make.add_argument(
        "--not-thread-safe",
        dest="thread_safe",
        action="store_false",
        help="write mmprep.json declaring the processor not thread-safe (1 worker)",
    )
    make.add_argument(
        "--declared-workers", type=_worker_count, default=None, help="write mmprep.json declaring this processor worker count"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmprep-runtime",
        description="Clone-per-thread multimodal preprocessing server, with probe and bench.",
    )
    # The installed distribution's version: the one pyproject.toml states, nothing to keep in step.
    parser.add_argument("--version", action="version", version=f"%(prog)s {versions.version_of('mmprep') or 'unknown'}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    _add_probe(commands)
    _add_bench(commands)
    _add_calibrate(commands)
    _add_make_model(commands)
    return parser


def _prefer_passive_openmp() -> None:
    """Idle OpenMP threads sleep instead of spinning (unless the environment says otherwise).

    torch's OpenMP threads spin for a while after each parallel region by default. Between two
    short preprocessing ops that spinning burns the CPU the decode threads and the other workers
    need, and under a CPU quota it is throttled time. libgomp reads this once, when torch is
    imported, so it is set here, before any command imports torch.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("serve", "bench", "calibrate"):
        _prefer_passive_openmp()
        from mmprep_runtime.engine import memory

        memory.tune_allocator()
    if args.command == "make-model":
        from mmprep_runtime.synthetic import models

        try:
            out = models.make_model(
                args.kind,
                args.out,
                backend=args.backend,
                declared_workers=args.declared_workers,
                declared_io_workers=args.declared_io_workers,
                thread_safe=args.thread_safe,
            )
        except models.ModelBuildError as exc:
            print(f"mmprep-runtime make-model: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(out)
        return 0
    if args.command == "probe":
        from mmprep_runtime.commands import probe

        return probe.main(args)
    if args.command == "bench":
        from mmprep_runtime.commands import bench

        return bench.main(args)
    if args.command == "calibrate":
        from mmprep_runtime.commands import calibrate

        return calibrate.main(args)
    from mmprep_runtime.commands import serve

    return serve.main(args)


if __name__ == "__main__":  # pragma: no cover - `python -m mmprep_runtime.cli`
    sys.exit(main())
