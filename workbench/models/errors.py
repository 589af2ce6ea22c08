"""The error a model configuration raises, in a module of its own so that reading configs
(``config``) and validating them (``validate``) can both raise it without importing each other."""


class ConfigError(ValueError):
    """A model configuration the workbench cannot use; the message says what to change."""
