"""mmprep runtime: loads a Hugging Face processor, runs it on a pool of clone-per-thread workers,
and serves it over HTTP (mmprep's preprocess API and vLLM's render API).

Where a concern lives, from the top of the layers down (which may import which is the import
contracts in ``pyproject.toml``; ``make lint`` holds the code to them, and every module must be
placed in one):

- ``cli`` parses ``mmprep-runtime``'s command line; ``commands``: ``serve``, ``probe``, ``bench``
  and ``calibrate``, the latter two over the shared loops of ``measuring``.
- ``server``: the aiohttp application: ``app`` (``create_app``, registering every API's routes),
  ``requests`` (readiness, admission, deadline, metrics and error mapping around every API
  request), ``admission``, ``drain``, ``health`` (probes, /v1/info, /metrics), ``state``,
  ``lifecycle`` (the engine's and the backend's start in the background), ``listener``, ``logs``
  and ``metrics``. It holds one render backend and knows its protocol, not vLLM.
- ``apis``: one module per HTTP protocol, each declaring its routes (``routing.Route``) and what
  they are given (``routing.Serving``): ``preprocess`` (POST /v1/preprocess) and
  ``vllm_render_server`` (vLLM's render server: routes, model card, error shape).
- ``backends``: what renders a request, behind ``protocol.RenderBackend``: ``native`` (mmprep's own
  rendering on the engine), ``vllm`` (vLLM's own render processes: all code that knows vLLM),
  ``fallback`` (native first, vLLM for what native does not render exactly), ``choice`` (which
  path) and ``assembly`` (starts them); ``model_facts`` is what every path reads of the model.
- ``httpio`` (bodies read and answers written, ``messages``; media fetched under the URL rules,
  ``fetching``) and ``synthetic`` (real processor folders and media built locally, for
  ``make-model``, ``bench``, ``calibrate`` and the tests; never loaded at the CLI's start).
- ``engine``: everything that is not HTTP. ``loading`` (the processor and its facts), ``executor``
  (the worker pool: one processor clone per thread), ``pipeline`` (decode -> process -> encode),
  ``decoding`` (images, audio), ``stand_ins`` and ``patches`` (exact stand-ins bound so clones
  keep them), ``cuda`` (the pod's device), ``cpus`` and ``memory`` (threads and allocator), and
  ``core`` (the assembled engine: ``start_engine``, and ``Engine.serve``, the one served path).
- At the bottom, import-light so the operator can import them (the only runtime modules it may):
  ``sizing`` (the worker-count decision, shared with the operator), ``contract`` (the env and
  probe answer both sides use), ``calibration_report`` (the calibration Job's report and the
  choice of a count), ``exits`` (exit codes), ``declared`` (what a model folder declares),
  ``settings`` (the server's settings, grouped and typed), ``telemetry``, ``logfields`` (the
  standard log record fields), ``versions``; and ``errors`` (each request error with its HTTP
  status).
"""
