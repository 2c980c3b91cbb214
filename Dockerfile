# mmprep images from one file:
#   docker build --target operator -t mmprep-operator .   # kopf operator, no torch
#   docker build --target runtime  -t mmprep-runtime  .   # preprocessing server: torch, transformers
#   docker build --target runtime-vllm -t mmprep-runtime-vllm .  # the same, with vLLM (mmprep[vllm]):
#                                                          # the general render path, every model vLLM renders
#
# Needs BuildKit (RUN --mount). No `# syntax=` line on purpose: that would pull a frontend image,
# and air-gapped machines have no registry; the built-in frontend of Docker >= 20.10 suffices.
#
# BASE_IMAGE: any Debian-like image with python3 (>= 3.11) and the venv module. The default is
# the official image; hack/docker/build-base.sh builds a registry-free one with debootstrap.
# Nothing below is architecture-specific, so the same file builds arm64 images (GB200/GB300).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
# Read-only root filesystem: bytecode is compiled at install time, every cache points under /tmp
# (an emptyDir/tmpfs in the pod), and HOME is /tmp for libraries that insist on ~/.cache.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HOME=/tmp/.cache/huggingface \
    TORCHINDUCTOR_CACHE_DIR=/tmp/.cache/torchinductor \
    TRITON_CACHE_DIR=/tmp/.cache/triton \
    MPLCONFIGDIR=/tmp/.cache/matplotlib
# A named user (not just a number): some libraries look the user up in /etc/passwd.
RUN groupadd --system --gid 65532 mmprep \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin mmprep

# pip lives only here, in a venv of its own; final stages borrow it through a bind mount and
# install into /opt/venv with `pip --python`, so no installer or build tool ships in an image.
FROM base AS tools
RUN python3 -m venv /opt/tools

# The mmprep wheel. Only the package sources are mounted, so editing tests or charts does not
# rebuild it, and a source edit rebuilds only this small stage and the last layer of each image.
FROM tools AS wheel
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
# auto: offline from wheelhouse/ when it holds wheels; off: always PyPI (see hack/docker/pip.sh).
ARG WHEELHOUSE=auto
RUN --mount=type=bind,source=pyproject.toml,target=/src/pyproject.toml \
    --mount=type=bind,source=README.md,target=/src/README.md \
    --mount=type=bind,source=runtime,target=/src/runtime \
    --mount=type=bind,source=operator,target=/src/operator \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    --mount=type=bind,source=hack/docker/pip.sh,target=/usr/local/bin/mmprep-pip \
    --mount=type=secret,id=pip-cert \
    --mount=type=cache,target=/root/.cache/pip \
    cp -r /src /build \
 && mmprep-pip wheel --no-deps --wheel-dir /dist /build

# The requirement lists of both images, read from pyproject.toml. The dependency stages below mount
# only these files, and BuildKit keys such a mount by its content: an edit of pyproject.toml that
# leaves the requirements alone (a lint setting, a contract, the version of a tool) reuses the
# 6 GB runtime layer instead of reinstalling it.
FROM base AS requirements
RUN --mount=type=bind,source=pyproject.toml,target=/src/pyproject.toml \
    --mount=type=bind,source=hack/docker/requirements.py,target=/src/requirements.py \
    mkdir /requirements \
 && python3 /src/requirements.py /src/pyproject.toml --extra operator > /requirements/operator.txt \
 && python3 /src/requirements.py /src/pyproject.toml --extra runtime > /requirements/runtime.txt \
 && python3 /src/requirements.py /src/pyproject.toml --extra vllm > /requirements/vllm.txt

# Dependencies, one stage per image, on the bare base (pip is only bind-mounted from `tools`): the
# final image is this stage plus one small layer, so the 6 GB runtime venv is never copied twice.
# They depend on the requirement lists alone (not on the sources), so a source edit reuses them.
FROM base AS operator-deps
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
# auto: offline from wheelhouse/ when it holds wheels; off: always PyPI (see hack/docker/pip.sh).
ARG WHEELHOUSE=auto
RUN --mount=type=bind,from=tools,source=/opt/tools,target=/opt/tools \
    --mount=type=bind,from=requirements,source=/requirements/operator.txt,target=/src/requirements.txt \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    --mount=type=bind,source=hack/docker/pip.sh,target=/usr/local/bin/mmprep-pip \
    --mount=type=secret,id=pip-cert \
    --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv --without-pip /opt/venv \
 && mmprep-pip --python /opt/venv/bin/python install --requirement /src/requirements.txt

FROM base AS runtime-deps
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG WHEELHOUSE=auto
RUN --mount=type=bind,from=tools,source=/opt/tools,target=/opt/tools \
    --mount=type=bind,from=requirements,source=/requirements/runtime.txt,target=/src/requirements.txt \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    --mount=type=bind,source=hack/docker/pip.sh,target=/usr/local/bin/mmprep-pip \
    --mount=type=secret,id=pip-cert \
    --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv --without-pip /opt/venv \
 && mmprep-pip --python /opt/venv/bin/python install --requirement /src/requirements.txt

# The vLLM flavor's dependencies: vLLM (the version the engine runs: pyproject's `vllm` extra) with
# the torch and transformers it pins, and the runtime's light dependencies. ~10 GB; built only
# when asked for (`--target runtime-vllm`).
FROM base AS runtime-vllm-deps
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG WHEELHOUSE=off
RUN --mount=type=bind,from=tools,source=/opt/tools,target=/opt/tools \
    --mount=type=bind,from=requirements,source=/requirements/vllm.txt,target=/src/requirements.txt \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    --mount=type=bind,source=hack/docker/pip.sh,target=/usr/local/bin/mmprep-pip \
    --mount=type=secret,id=pip-cert \
    --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv --without-pip /opt/venv \
 && mmprep-pip --python /opt/venv/bin/python install --requirement /src/requirements.txt

# ---- operator: kopf + kubernetes client, no torch --------------------------------------------
FROM operator-deps AS operator
RUN --mount=type=bind,from=tools,source=/opt/tools,target=/opt/tools \
    --mount=type=bind,from=wheel,source=/dist,target=/dist \
    /opt/tools/bin/pip --disable-pip-version-check --python /opt/venv/bin/python \
      install --no-deps --no-index /dist/*.whl
USER 65532:65532
ENTRYPOINT ["mmprep-operator"]
CMD ["run"]

# ---- runtime: the preprocessing server -------------------------------------------------------
FROM runtime-deps AS runtime
RUN --mount=type=bind,from=tools,source=/opt/tools,target=/opt/tools \
    --mount=type=bind,from=wheel,source=/dist,target=/dist \
    /opt/tools/bin/pip --disable-pip-version-check --python /opt/venv/bin/python \
      install --no-deps --no-index /dist/*.whl
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["mmprep-runtime"]
CMD ["serve", "--help"]

# ---- runtime-vllm: the preprocessing server with vLLM's own processing beside it ----------------
# vLLM renders on the CPU here (no GPU kernels run in a render tier); its cache dirs go under /tmp
# like every other cache, so the root filesystem stays read-only.
FROM runtime-vllm-deps AS runtime-vllm
ENV VLLM_TARGET_DEVICE=cpu \
    VLLM_CACHE_ROOT=/tmp/.cache/vllm \
    VLLM_CONFIG_ROOT=/tmp/.config/vllm \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1
RUN --mount=type=bind,from=tools,source=/opt/tools,target=/opt/tools \
    --mount=type=bind,from=wheel,source=/dist,target=/dist \
    /opt/tools/bin/pip --disable-pip-version-check --python /opt/venv/bin/python \
      install --no-deps --no-index /dist/*.whl
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["mmprep-runtime"]
CMD ["serve", "--help"]
