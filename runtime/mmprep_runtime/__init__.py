"""mmprep runtime: loads a Hugging Face processor, runs it on a pool of clone-per-thread workers,
and serves it over HTTP (mmprep's preprocess API and vLLM's render API).

Where a concern lives (the layers, and which may import which, are the import contracts in
``pyproject.toml``; ``make lint`` holds the code to them):

- ``engine``: everything that is not HTTP. ``loading`` (the processor and its facts), ``executor``
  (the worker pool: one processor clone per thread), ``pipeline`` (decode -> process -> encode),
  ``decoding`` (images, audio), ``fast_paths`` and ``patches`` (exact stand-ins bound so clones
  keep them), ``cuda`` (the pod's device), ``cpus`` and ``memory`` (threads and allocator), and
  ``core`` (the assembled engine: ``start_engine``, and ``Engine.serve``, the one served path).
- ``apis``: the two HTTP APIs as thin adapters over the engine. ``preprocess`` (POST
  /v1/preprocess); the vLLM render API: ``vllm_endpoints`` (its routes' handlers and model card),
  ``vllm_render`` (its stages), ``vllm_model``, ``vllm_answer`` and ``vllm_format`` (vLLM's wire
  formats), ``openai_chat`` (chat bodies) and ``fetching`` (image URLs); ``http`` (body reading).
- ``server``: the aiohttp application: ``app`` (``create_app`` and its routes), ``requests``
  (readiness, admission, deadline, metrics and error mapping around every API request),
  ``admission``, ``health`` (probes, /v1/info, /metrics), ``state``, ``lifecycle`` (the engine's
  background start) and ``metrics`` (Prometheus).
- ``commands``: ``serve``, ``probe``, ``bench`` and ``calibrate``, the latter two over the shared
  loops of ``measuring``; ``cli`` parses ``mmprep-runtime``'s command line.
- At the top, import-light so the operator can import them: ``sizing`` (the worker-count
  decision, shared with the operator), ``contract`` (the env and probe answer both sides use),
  ``calibration_report`` (the calibration Job's report and the choice of a count), ``exits``
  (exit codes), ``declared`` (what a model folder declares), ``settings`` (the server's
  settings, grouped and typed), and ``errors`` (each request error with its HTTP status).
  ``versions``, ``testing_models`` and ``testing_media`` (real processor folders and media for
  tests and demos).
"""
