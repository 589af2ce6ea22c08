"""The error a model configuration the workbench cannot use raises (its own module so that the
config readers and ``hf_keys`` share it without importing each other)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A model configuration the workbench cannot use; the message says what to change."""
