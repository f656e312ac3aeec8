"""Experiment configs: structured dataclasses registered with Hydra, loaded from YAML + overrides."""

from alight.config.loading import load_config, to_dict, to_object, to_yaml
from alight.config.schema import (
    AdapterConfig,
    AgentConfig,
    AlgorithmConfig,
    DataConfig,
    DevConfig,
    EngineConfig,
    ExperimentConfig,
    ProxyConfig,
    RayConfig,
    RunnerConfig,
    SamplingConfig,
    StoreConfig,
)

__all__ = [
    "AdapterConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "DataConfig",
    "DevConfig",
    "EngineConfig",
    "ExperimentConfig",
    "ProxyConfig",
    "RayConfig",
    "RunnerConfig",
    "SamplingConfig",
    "StoreConfig",
    "load_config",
    "to_dict",
    "to_object",
    "to_yaml",
]
