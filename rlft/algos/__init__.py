"""The algorithms as pure tensor functions: losses (registered ratio levels, KL estimators, aggregations),
advantage estimators, reward shaping, and the per-step settings built from the config."""
