"""Where a peer's training data comes from: a job's shipped corpus fetched over the swarm (``feed``),
or files on this machine at the places its volunteer allows (``paths``)."""
