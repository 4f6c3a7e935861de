"""specresearch: a research framework for speculative decoding of LLMs."""

__version__ = "0.1.0"
