"""The CUDA tier: tests that need a GPU. Every test here is skipped, with the reason printed,
where torch sees no CUDA device; ``hack/gpu-check.sh`` runs them (and the GPU-path bench) on a
GPU machine."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import pytest

from mmprep_runtime.synthetic import models


def _why_no_cuda() -> str | None:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover
        return f"torch cannot be imported: {exc}"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return f"no CUDA device visible to torch {torch.__version__} (CUDA {torch.version.cuda})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = _why_no_cuda()
    if why is None:
        return
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {why}"))


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., pathlib.Path]:
    cache: dict[str, pathlib.Path] = {}

    def make(kind: str) -> pathlib.Path:
        if kind not in cache:
            cache[kind] = models.make_model(kind, tmp_path_factory.mktemp(f"model-{kind}"), backend="torchvision")
        return cache[kind]

    return make


@pytest.fixture(scope="session")
def qwen_dir(model_factory: Callable[..., pathlib.Path]) -> pathlib.Path:
    return model_factory("qwen2-vl")
