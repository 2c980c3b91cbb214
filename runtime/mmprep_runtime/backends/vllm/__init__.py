"""vLLM's own render server in worker processes: the pool (``worker_pool``), the process
(``worker``, with ``answer_splice`` and ``audio_backends``), the socket hand-off (``handoff``),
the front that forwards to them (``forwarding``), and the ``RenderBackend`` over it all
(``backend``). The one room for code that knows vLLM."""
