#!/usr/bin/env bash
# The GPU path on a GPU machine, in under 10 minutes: the CUDA tests (tests/gpu), then the bench
# of the GPU path at 1 and 2 processor workers with the CPU path measured beside it in the same
# run. Results go to benchmarks/gpu/ (commit them with the machine's name in the message).
#
#   hack/gpu-check.sh                # uses .venv (make venv first)
#   MMPREP_GPU_BENCH_SECONDS=20 ...  # seconds of load per configuration (default 20)
#
# Where torch sees no CUDA device, it says why and exits 2 without measuring anything.
set -euo pipefail
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO_DIR/.venv/bin/python}
OUT=${MMPREP_GPU_OUT:-$REPO_DIR/benchmarks/gpu}
SECONDS_PER_CONFIG=${MMPREP_GPU_BENCH_SECONDS:-20}
log() { printf '[gpu-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

cd "$REPO_DIR"
why=$("$PY" - <<'PY'
import torch
if torch.version.cuda is None:
    print(f"torch {torch.__version__} is built without CUDA")
elif not torch.cuda.is_available():
    print(f"no CUDA device visible to torch {torch.__version__} (CUDA {torch.version.cuda})")
PY
)
if [ -n "$why" ]; then
  log "no GPU here: $why"
  exit 2
fi
"$PY" -c 'import torch; print(torch.cuda.get_device_name(0), torch.version.cuda, torch.__version__)' | tee /dev/stderr >/dev/null

log "CUDA tests (tests/gpu)"
timeout 240 "$PY" -m pytest -rs -q -s tests/gpu

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model="$work/qwen2-vl"
"$PY" -m mmprep_runtime.cli make-model --kind qwen2-vl --out "$model"
mkdir -p "$OUT"

# 3 interleaved rounds per run; each run's direct baseline is on that run's device (bench binds it).
log "bench: GPU path, 1 and 2 workers (${SECONDS_PER_CONFIG}s each)"
timeout 200 "$PY" -m mmprep_runtime.cli bench --model "$model" --device cuda --workers 1,2 \
  --duration "$SECONDS_PER_CONFIG" --image 1280x960 --rounds 3 --no-progress --json "$OUT/cuda.json" >/dev/null
log "bench: CPU path beside it, 1 and 2 workers"
timeout 200 "$PY" -m mmprep_runtime.cli bench --model "$model" --device cpu --workers 1,2 \
  --duration "$SECONDS_PER_CONFIG" --image 1280x960 --rounds 3 --no-progress --json "$OUT/cpu.json" >/dev/null

"$PY" - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = ["| device | run | workers | req/s | p50 ms | p99 ms | x direct |", "|---|---|---|---|---|---|---|"]
for name in ("cuda", "cpu"):
    report = json.loads((out / f"{name}.json").read_text())
    for row in [report["direct"], *report["results"]]:
        rows.append(
            f"| {report['device']} | {row.get('label', 'pool')} | {row.get('workers', 1)} | {row['req_per_s']} | "
            f"{row.get('p50_ms')} | {row.get('p99_ms')} | {row.get('throughput_vs_direct', 1.0)} |"
        )
(out / "results.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
PY
log "done: $OUT/results.md"
