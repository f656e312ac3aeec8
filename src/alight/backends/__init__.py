"""Policy-update backends: `embedded` (PyTorch in the trainer's process); each consumes `TransitionBatch`es."""
