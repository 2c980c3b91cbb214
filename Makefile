# The two commands of the quick start are `make demo` and `make test`; the rest are their parts.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: venv test unit demo cluster-up cluster-down crd

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[runtime,operator,test]'
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest tests

unit: venv
	$(PY) -m pytest tests/unit
