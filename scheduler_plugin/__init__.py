"""kelvin: a GPU-aware scheduling extension for Kubernetes."""

__version__ = "0.1.0"
