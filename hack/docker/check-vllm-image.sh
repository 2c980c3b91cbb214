#!/usr/bin/env bash
# Builds the runtime's vLLM flavor (mmprep-runtime-vllm:$IMAGE_TAG, ~10 GB) and checks that it
# serves as the operator runs it: non-root, read-only root filesystem, /tmp the only writable
# place, models mounted read-only. In the image, for a vision family (Idefics3) and an audio one
# (Qwen2-Audio), both on mmprep's native fast path under auto:
#   - `probe` reports vLLM's version and the native render path;
#   - `serve --api vllm-render` answers /version, /v1/info (Idefics3 under auto: native, vLLM's
#     render process beside it; Qwen2-Audio under general: vLLM's processing) and a render request
#     with an image (or a WAV clip), 200 with token ids;
#   - `calibrate --render-path general` measures render processes.
#
#   hack/docker/check-vllm-image.sh [--remove]     --remove: delete the image afterwards (disk)
#
# Not part of `make test` (its ~10 GB and the build's minutes do not fit CI's disk and time);
# the compatibility suite runs the same code from vLLM's virtualenv instead.
set -euo pipefail
here=$(dirname "$0")
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
remove=0
[ "${1:-}" != --remove ] || remove=1

free_gb=$(df -Pk "$repo" | awk 'NR == 2 {print int($4 / 1048576)}')
[ "$free_gb" -ge 25 ] || die "the vLLM image needs ~25 GB free to build (image, pip cache, layers); $free_gb GB free"
"$here/build-images.sh" runtime-vllm
docker_cli
image="${IMAGE_PREFIX}runtime-vllm:$IMAGE_TAG"
work=$(mktemp -d)
names=()
cleanup() {
  for n in "${names[@]}"; do docker rm -f "$n" >/dev/null 2>&1 || true; done
  rm -rf "$work"
  if [ "$remove" = 1 ]; then docker rmi "$image" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

py="$repo/.venv/bin/python"
[ -x "$py" ] || die "no $py: run 'make venv' first (it builds the model folders)"
# kind:--render-path:the path /v1/info reports
families=(idefics3:auto:native qwen2-audio:general:general)
for family in "${families[@]}"; do
  kind=${family%%:*}
  "$py" -m mmprep_runtime.cli make-model --kind "$kind" --out "$work/models/$kind" >/dev/null
done
chmod -R a+rX "$work/models"

# As the operator renders the pod: non-root, read-only root, a tmpfs /tmp, the models read-only.
run() {
  docker run --user 65532:65532 --read-only --tmpfs /tmp:exec,size=4g --cap-drop ALL \
    --security-opt no-new-privileges -e HF_HUB_OFFLINE=1 -v "$work/models:/models:ro" "$@"
}

for family in "${families[@]}"; do
  IFS=: read -r kind setting path <<<"$family"
  log "$kind: probe"
  probe=$(run --rm "$image" probe --model "/models/$kind")
  "$py" - "$probe" <<'PY'
import json, sys
answer = json.loads(sys.argv[1])
assert answer["render_path"] == "native", answer
assert answer["versions"].get("vllm"), answer
print(f"probe: {answer['processor_class']}, render path {answer['render_path']}, vLLM {answer['versions']['vllm']}")
PY

  log "$kind: serve"
  name="mmprep-vllm-check-$kind-$$"
  names+=("$name")
  run -d --name "$name" -p 127.0.0.1::8000 "$image" \
    serve --model "/models/$kind" --host 0.0.0.0 --port 8000 --render-path "$setting" --render-processes 1 \
    --vllm-args "--mm-processor-cache-gb 0" >/dev/null
  port=$(docker port "$name" 8000/tcp | head -n1 | sed 's/.*://')
  healthy() { curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; }
  for _ in $(seq 1 300); do healthy && break; sleep 1; done
  healthy || { docker logs "$name" | tail -40 >&2; die "$kind: the server did not become healthy in 300 s"; }
  "$py" - "$port" "$kind" "$path" <<'PY'
import base64, json, sys, urllib.request
from mmprep_runtime.synthetic import media

port, kind, path = sys.argv[1], sys.argv[2], sys.argv[3]
base = f"http://127.0.0.1:{port}"
version = json.load(urllib.request.urlopen(base + "/version", timeout=30))
info = json.load(urllib.request.urlopen(base + "/v1/info", timeout=30))["vllm_render"]
assert info["path"] == path and info["general"]["ready_processes"] == 1, info
if kind == "qwen2-audio":
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(media.wav(1.0)).decode(), "format": "wav"}}
else:
    url = "data:image/jpeg;base64," + base64.b64encode(media.jpeg(640, 480, seed=1)).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
body = {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}]}
request = urllib.request.Request(base + "/v1/chat/completions/render", json.dumps(body).encode(), {"Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(request, timeout=300))
assert answer["token_ids"], answer
print(f"serve: vLLM {version['version']}, {info['path']} path, {len(answer['token_ids'])} token ids")
PY
  docker rm -f "$name" >/dev/null
done

log "qwen2-audio: calibrate"
report=$(run --rm "$image" calibrate --model /models/qwen2-audio --render-path general --max-workers 2 \
  --duration 4 --rounds 2 --warmup 1 2>/dev/null | tail -n1)
"$py" - "$report" <<'PY'
import json, sys
report = json.loads(sys.argv[1])
assert report["dimension"] == "renderProcesses" and report["chosen"], report
print("calibrate: " + ", ".join(f"{p['workers']} process(es) {p['reqPerS']} req/s" for p in report["curve"]) + f"; chosen {report['chosen']}")
PY
log "the vLLM image serves, probes and calibrates as the operator runs it: $image ($(( $(docker image inspect --format '{{.Size}}' "$image") / 1000000 )) MB)"
