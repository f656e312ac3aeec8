"""A sandbox per attempt: a fresh working copy, no network but the proxy, limits (agent.sandbox)."""

from alight.sandbox.base import RunResult, Sandbox, SandboxError
from alight.sandbox.factory import check_sandbox, open_sandbox, sandbox_environment

__all__ = ["RunResult", "Sandbox", "SandboxError", "check_sandbox", "open_sandbox", "sandbox_environment"]
