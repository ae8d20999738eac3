"""The config's one exception, apart so that ``trainer.config`` and ``trainer.config.hf`` both raise it."""


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong type; the message names the key."""
