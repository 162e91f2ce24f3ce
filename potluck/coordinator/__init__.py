"""The coordinator: the service that publishes a job and its plans, swarm state, admission, the allocator
of a swarm of several jobs, and the pure planning it runs (job/, allocation/, placement/, trees/)."""
