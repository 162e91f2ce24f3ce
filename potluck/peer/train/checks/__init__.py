"""The replicas' checks of each other's work (docs/security.md): ``spot`` recomputes random micro-batches
of a pipeline stage, ``audit`` reruns a shard owner's aggregation rule, ``recheck`` recomputes the step of
a peer the rule clipped, ``evidence`` is what they share. Which checks a plan runs:
``protocol.training.spot_checked``, ``audited``, ``gradients_rechecked``."""
