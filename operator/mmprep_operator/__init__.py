"""mmprep operator: reconciles MultimodalPreprocessor resources into per-GPU-pool runtime Deployments."""

__version__ = "0.1.0"
