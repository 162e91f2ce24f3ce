"""The coordinator: swarm state, planner, tree packing, and the service that publishes plans."""
