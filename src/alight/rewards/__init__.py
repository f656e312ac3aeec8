"""Rewards without a reward function: the tests of a working copy, an LLM judge (reward.kind)."""
