"""Hearth: an LLM server that keeps conversations warm."""

__version__ = "0.1.0"
