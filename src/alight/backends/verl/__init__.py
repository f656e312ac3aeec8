"""The verl backend: verl's FSDP workers on Ray update the policy from alight's `TransitionBatch`es."""
