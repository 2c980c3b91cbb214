"""Synthetic models and media: real processor folders built from transformers classes and small
tokenizers (``models``, ``families``), and images, audio and video to send them (``media``).

For ``make-model``, ``bench``, ``calibrate`` and the tests; imported only where one of them runs,
never when the CLI starts (``import mmprep_runtime.cli`` loads none of it)."""
