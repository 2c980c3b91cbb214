# The two commands of the quick start are `make demo` and `make test`; the rest are their parts.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: venv test unit demo cluster-up cluster-down cluster-status control-plane crd

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[runtime,operator,test]'
	touch $@

venv: $(VENV)/.installed

# The control-plane binaries are built (once, cached under ~/.cache/mmprep) before pytest starts,
# so the cold build prints its progress here instead of inside a test's timeout.
test: venv control-plane
	$(PY) -m pytest tests

unit: venv
	$(PY) -m pytest tests/unit

# --- local control plane (hack/): real etcd, kube-apiserver, controller-manager, scheduler, KWOK
control-plane:
	hack/build-control-plane.sh >/dev/null

cluster-up: venv
	hack/cluster-up.sh

cluster-down:
	hack/cluster-down.sh

cluster-status:
	hack/cluster-status.sh

# Quick start, part one: cluster + CRD + operator + example resources, then their decisions.
demo: venv
	hack/demo.sh
