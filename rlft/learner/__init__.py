"""The learner: per-token log-probs (logprobs.py), the policy and its update (policy.py), and one rank's
whole job, policy + reference + checkpoints + weights for the engines (local.py)."""
