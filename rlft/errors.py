class UserError(Exception):
    """A problem with what the user gave (config, files, reward functions), reported as one line."""


class ConfigError(UserError):
    """A config or input problem found at start-up, before any work."""


class RewardError(UserError):
    """A reward function raised; the message names the function and the sample."""


class WorkerDied(RuntimeError):
    """A learner rank (or a rollout worker past its restarts) died; the last checkpoint is intact."""
