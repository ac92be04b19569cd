def first_line(err: BaseException) -> str:
    """An exception's first line (libraries' messages run to many), or its type's name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class UserError(Exception):
    """A problem with what the user gave (config, files, reward functions), reported as one line."""


class ConfigError(UserError):
    """A config or input problem found at start-up, before any work."""


class RewardError(UserError):
    """A reward function raised; the message names the function and the sample."""


class WorkerDied(RuntimeError):
    """A learner rank (or a rollout worker past its restarts) died; the last checkpoint is intact."""


class NonFiniteWeights(UserError):
    """An update made the weights NaN or infinite; nothing of it was saved, the last checkpoint is intact."""


class NonFiniteUpdates(UserError):
    """trainer.max_nonfinite_steps steps in a row had a non-finite loss or gradient norm."""


class Interrupted(UserError):
    """SIGINT or SIGTERM; the message names the last intact checkpoint."""
