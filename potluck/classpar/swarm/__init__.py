"""The class-parallel job kind on a swarm (docs/class-parallel.md): the wing that plugs ``classpar``'s
one-machine library into the peer and the coordinator through their job-kind seams.

``plan`` decides (pure: records -> ``ClassParPlan``), ``service`` runs the coordinator's side, ``check``
measures the sub-networks holders name, ``peer`` is the volunteer's side (train, build, hold, serve),
``streams`` the request/response protocol they speak, ``client`` what ``potluck serve`` asks with.
Neither ``peer`` nor ``coordinator`` imports this package: the CLI hands them its kind.
"""
