"""A swarm simulator on a virtual clock: churn traces, peers timed by the real cost model, and the real
``placement.plan`` deciding every re-plan. Pure and deterministic for its seeds, apart from the planner's
own wall-clock search limits and the measured decision times. Never ``net`` or the daemon.

Parts: ``engine`` (event queue), ``churn`` (session lengths, traces), ``population`` (hardware mix and
home links), ``liveput`` (churn-aware inputs), ``coordinator`` (policies around ``placement.plan``),
``run`` (one simulated run; ``runconfig`` its knobs and result), ``dht`` (Kademlia traffic per peer),
``replay`` (a real chaos run replayed), ``report`` (summary, CSV), ``reference`` (the reference job and
trace). Guide: docs/sim.md.
"""
