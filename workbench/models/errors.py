"""The error a model configuration the workbench cannot use raises, in a module of its own so
that reading configs (``config``, ``hf_keys``) and validating them (``validate``) can all raise
it without importing each other."""

from __future__ import annotations


class ConfigError(ValueError):
    """A model configuration the workbench cannot use; the message says what to change."""
