"""What renders a request, behind one small protocol (``protocol.RenderBackend``).

- ``native``: mmprep's own rendering on the clone-per-thread engine, byte-equal to vLLM for the
  families it serves;
- ``vllm``: vLLM's own render server in worker processes; all of mmprep's vLLM-specific code
  lives there, and nothing outside this package imports it but ``assembly``;
- ``fallback``: a native backend with a general one beside it, for what the native path does
  not render exactly;
- ``choice`` (pure) picks the path, ``assembly`` starts the backends it needs.

The server holds one ``RenderBackend`` and knows no more of it: another engine's render side
(SGLang, TGI) is one more subpackage here and one more branch in ``assembly``.
"""
