"""A stage's state over the swarm: snapshots, signed chunked manifests, serving and pulling.

Shared by peers (live hand-off between replicas, checkpoint copies) and the coordinator (the job owner's
checkpoint copy, served back when a stage lost every replica), which is why it sits below both.
"""
