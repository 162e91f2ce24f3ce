"""Synchronising a stage's replicas: tree and ring all-reduce, bucketed overlap with the backward, partial
participation, DiLoCo local steps.
"""
