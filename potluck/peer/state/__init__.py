"""Where a stage's weights and optimizer state come from: re-laying layers across new stage boundaries."""
