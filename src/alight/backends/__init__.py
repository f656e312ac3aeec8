"""Policy-update backends behind the `Backend` protocol (`base.py`), chosen by `trainer.backend`
(`factory.py`): `embedded` (PyTorch in the trainer's process) and `verl` (verl's workers on Ray).
Each consumes `TransitionBatch`es."""
