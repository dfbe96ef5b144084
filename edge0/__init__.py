"""Edge0: stream the experts of a Mixture-of-Experts model from disk, on MLX."""

from edge0.errors import Edge0Error

__version__ = "0.1.0"

__all__ = ["Edge0Error", "__version__"]
