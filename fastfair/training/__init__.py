"""Training: the trainer's loop, per-class state and statistics, weight averaging, checkpoint selection."""
