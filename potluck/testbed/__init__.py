"""Real potluck code on fake networks, for the demo, tests and benchmarks: local swarms, in-process link
shaping, network namespaces, test topologies.
"""
