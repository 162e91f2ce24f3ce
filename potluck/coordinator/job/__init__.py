"""One job's lifecycle, pure: records -> placement -> TrainPlan, and what to do next from peers' progress."""
