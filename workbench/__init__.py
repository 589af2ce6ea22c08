"""Research workbench for GPU scheduling of LLM token generation."""

__version__ = "0.1.0"
