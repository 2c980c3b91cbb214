"""mmprep's own rendering of vLLM's render API on the clone-per-thread engine: the chat body
parsed (``chat_request``), the stages run (``stages``), the GenerateRequest written
(``generate_request``, ``wire_format``) byte-equal to what vLLM answers; ``backend`` is the
``RenderBackend`` over them."""
