class ConfigError(Exception):
    """A problem with the user's config or inputs, reported as one line before any work starts."""
