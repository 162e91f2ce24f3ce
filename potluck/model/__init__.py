"""What is trained, on one machine: the transformer and its stages, data, optimizer, checkpoints, sampling
and the single-process reference. No networking, no event loop.
"""
