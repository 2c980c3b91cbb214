"""The HTTP APIs, one module each, thin adapters over the engine and the render backend: mmprep's
``POST /v1/preprocess`` (``preprocess``) and vLLM's render server (``vllm_render_server``). Each
declares its routes (``ROUTES``, of ``routing.Route``) and reads what it needs from
``routing.Serving``; the server registers them and knows no route by name. An adapter parses and
encodes; where each stage runs is the engine's or the backend's decision.
"""
