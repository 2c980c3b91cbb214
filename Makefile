# The two commands of the quick start are `make demo` and `make test`; the rest are their parts.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: venv test unit integration compat e2e lint gpu-check demo cluster-up cluster-down cluster-status control-plane crd vllm-venv

# uv installs the extras from its cache (~/.cache/uv, hard links where it can): 20 s on a machine
# that has installed them once, where pip (which keeps no cache of these wheels here) downloaded
# and unpacked about 6 GB on every fresh clone, 100 s of every CI run. The same packages. Bytecode
# is compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, no import writes it
# later, and every process would compile torch and transformers again (5 s each).
UV_VERSION := 0.13.9
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip 'uv==$(UV_VERSION)'
	$(PY) -m uv pip install --python $(PY) --compile-bytecode -e '.[runtime,operator,test,lint]'
	touch $@

venv: $(VENV)/.installed

# The control-plane binaries are built and vLLM's virtualenv installed (once each, cached under
# ~/.cache/mmprep) before pytest starts, so a cold install prints its progress here instead of
# inside a test's timeout.
# --durations: the slowest tests, where a CI run that nears its time budget spends it.
test: venv control-plane vllm-venv
	$(PY) -m pytest tests --durations=25

# Each tier alone (docs/development.md, "Tests", has what each covers and takes). integration and
# e2e share the local control plane (tests/conftest.py starts it when absent); e2e also needs the
# images and the kind node image, which `make images kind-node-image` builds (CI: hack/ci-build.sh).
unit: venv
	$(PY) -m pytest tests/unit

integration: venv control-plane
	$(PY) -m pytest tests/integration --durations=10

compat: venv vllm-venv
	$(PY) -m pytest tests/compat --durations=10

e2e: venv control-plane
	$(PY) -m pytest -rs tests/e2e --durations=10

# Lint, format, types and layers; configured in pyproject.toml. Runs every check, then fails if any did.
# mypy's cache lives outside the checkout: a fresh clone (CI) then re-checks only what changed since
# the last run on this machine (mypy compares each file's hash, not its path or mtime): 45 s to 5.
lint: venv
	@status=0; \
	echo "== ruff check"; $(VENV)/bin/ruff check . || status=1; \
	echo "== ruff format --check"; $(VENV)/bin/ruff format --check . || status=1; \
	echo "== mypy (strict)"; MYPY_CACHE_DIR=$${MYPY_CACHE_DIR:-$$HOME/.cache/mmprep/mypy} $(VENV)/bin/mypy || status=1; \
	echo "== lint-imports"; $(VENV)/bin/lint-imports || status=1; \
	exit $$status

# The CUDA tests and the GPU-path bench (1 and 2 workers, the CPU path beside it); GPU machines only.
gpu-check: venv
	hack/gpu-check.sh

# --- local control plane (hack/): real etcd, kube-apiserver, controller-manager, scheduler, KWOK
control-plane:
	hack/build-control-plane.sh >/dev/null
	hack/keda-crds.sh >/dev/null

# vLLM in its own virtualenv (it pins its own torch and transformers), for tests/compat/ and the
# render benchmark: the peer the vLLM render API is compared with.
vllm-venv:
	hack/vllm/venv.sh >/dev/null
	hack/vllm/venv.sh cpu-engine >/dev/null

cluster-up: venv
	hack/cluster-up.sh

cluster-down:
	hack/cluster-down.sh

cluster-status:
	hack/cluster-status.sh

# Quick start, part one: cluster + CRD + operator + example resources, then their decisions.
demo: venv
	hack/demo.sh

# --- packaging (hack/docker/, charts/mmprep/): images, chart checks, kind e2e -------------------
.PHONY: crd-reference images helm-lint chart-sync kind-node-image kind-up kind-down kind-e2e
# Both images, from a local debootstrap base and a host wheelhouse (no registry needed; cached).
# Online: make images BASE_IMAGE=python:3.11-slim-bookworm MMPREP_WHEELHOUSE=0
images:
	hack/docker/build-images.sh

helm-lint: venv control-plane
	$(PY) -m pytest tests/e2e/test_helm_chart.py

# The CRD, generated from the operator's models by one command into both committed copies: crds/
# (kubectl apply -f crds/) and the chart's crds/ (Helm installs it from there). A unit test
# (tests/unit/operator/test_crd_generation.py) fails when either drifts.
CRD_FILE := multimodalpreprocessors.mmprep.dev.yaml
crd: venv crd-reference
	$(VENV)/bin/mmprep-operator crd | tee crds/$(CRD_FILE) > charts/mmprep/crds/$(CRD_FILE)

# The CRD reference, from the same models (tests/unit/operator/test_crd_reference.py holds it to them).
crd-reference: venv
	$(VENV)/bin/mmprep-operator crd-reference > docs/crd-reference.md

# Regenerates what the chart copies from the operator (its CRD and its RBAC rules) and the values
# table of its README (from values.yaml).
chart-sync: crd
	$(VENV)/bin/mmprep-operator rbac > charts/mmprep/files/operator-clusterrole.yaml
	$(VENV)/bin/mmprep-operator rbac --leader-election > charts/mmprep/files/operator-leader-election-role.yaml
	$(PY) hack/chart/values_table.py

# The kind node image, built offline from Debian packages and Go modules (hack/kind/; cached).
kind-node-image:
	hack/kind/build-node-image.sh

# A kind cluster (1 control plane, a fake H200 worker, a CPU worker) with the images and the chart.
kind-up: venv images kind-node-image
	hack/docker/kind-up.sh

kind-down:
	hack/docker/kind-down.sh

# The kind suite alone (it also runs in `make test`): its own cluster, deleted afterwards.
kind-e2e: venv control-plane images kind-node-image
	$(PY) -m pytest -rs tests/e2e/test_kind_e2e.py
