"""Inference engines behind the LLM proxy: embedded (transformers), vLLM, LiteLLM.

Every engine implements `alight.engines.base.Engine` (its request and answer types live there too);
`alight.engines.factory.make_engine` builds the one a config names.
"""

from alight.engines.base import Engine, SamplingParams

__all__ = ["Engine", "SamplingParams"]
