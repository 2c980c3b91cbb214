"""The engine: the processor loaded, cloned per worker thread, and run decode -> process -> encode.

Knows nothing of HTTP or of the commands (the contracts in ``pyproject.toml``): both APIs and
``bench`` reach it through ``core.Engine.serve`` and ``core.start_engine``.
"""
