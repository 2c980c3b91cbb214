#!/usr/bin/env bash
# Builds everything `make test` needs, phase by phase, each timed (hack/phases.sh):
#
#   hack/ci-build.sh       the Python environment, lint, the control plane and vLLM's virtualenvs
#                          (side by side), the Docker engine, both images and the kind node image
#
# Every step installs the Debian packages it needs itself (hack/system-packages.txt) and caches
# its result by version outside the repo, so a warm machine passes through in seconds. .ci/run
# calls it before the tests; hack/clean-root-check.sh runs it in a clean Debian root to prove that
# nothing here depends on a package installed by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/phases.sh
trap phase_end EXIT

phase "python environment"
hack/system-packages.sh build
make venv
# Right after the environment, before the long builds: a lint failure stops CI in minutes.
phase "lint, format, types and import layers"
make lint
# The control plane (Go, CPU-bound) and vLLM's virtualenvs (mostly downloads) overlap well even on
# two cores. Each logs to its own file, shown when it fails.
phase "control plane + vLLM's virtualenvs (side by side)"
logs=$(mktemp -d)
hack/build-control-plane.sh >"$logs/control-plane.log" 2>&1 &
cp_job=$!
# vLLM's render peer, then its CPU build (the engine the generate-server test runs).
(hack/vllm/venv.sh && hack/vllm/venv.sh cpu-engine) >"$logs/vllm.log" 2>&1 &
vllm_job=$!
failed=()
wait "$cp_job" || failed+=("the control plane build")
wait "$vllm_job" || failed+=("vLLM's virtualenvs")
cat "$logs/control-plane.log" "$logs/vllm.log"
rm -rf "$logs"
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]} (its log is above)"; exit 1; }

phase "Docker engine"
if ! hack/docker/start-dockerd.sh; then
  # Without a Docker engine the kind tier skips and says why (tests/support/packaging_support.py).
  echo "no Docker engine can run here: the image and kind tiers will be skipped"
  exit 0
fi
phase "images (base, wheelhouse, operator, runtime)"
hack/docker/build-images.sh
phase "kind binaries and node image"
hack/kind/build-node-image.sh
# Go's build cache (about 7 GB after the control plane and the node image) serves only a rebuild
# after a version change, which is rare and cold anyway; the kind tier needs that disk now: its
# nodes load the 6 GB runtime image each.
if command -v go >/dev/null; then
  go clean -cache
  echo "Go's build cache cleared: $(df -Pm / | awk 'NR == 2 { print $4 }') MB free"
fi
