"""A sandbox per attempt: a fresh working copy, no network but the proxy, limits (agent.sandbox)."""
