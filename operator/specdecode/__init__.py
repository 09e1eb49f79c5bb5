"""specdecode-operator: measure whether vLLM speculative decoding pays off, and say so in status."""

__version__ = "0.1.0"
