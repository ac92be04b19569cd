"""The distributed layer: Ray placement (placement.py), the actor processes of learner ranks and rollout
workers (learner_actors.py, rollout_actors.py), how a batch splits over ranks (ranks.py), and the weight
broadcast from learner rank 0 to the engines (broadcast.py). It imports neither rlft.learner nor
rlft.rollout: the trainer hands it factories that build a rank's learner and a worker's engine."""
