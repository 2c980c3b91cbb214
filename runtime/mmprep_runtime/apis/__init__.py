"""The two HTTP APIs, thin adapters over the engine: mmprep's ``POST /v1/preprocess`` and vLLM's
render API. An adapter parses and encodes; where each stage runs is the engine's decision.
"""
