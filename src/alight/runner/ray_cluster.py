"""Joining Ray for the runner pool, and where its actors may run (`runner.ray`)."""

from __future__ import annotations

import importlib.util
import logging
import math
from typing import Any

from alight.config.schema import RayConfig
from alight.errors import ConfigError

logger = logging.getLogger(__name__)

RAY_EXTRA = "pip install 'alight[ray]'"


def check_ray(cfg: RayConfig) -> None:
    """ConfigError for Ray settings that cannot work, or for Ray not being installed."""
    if not (math.isfinite(cfg.num_cpus) and cfg.num_cpus >= 0):
        raise ConfigError(f"runner.ray.num_cpus must be a number >= 0, got {cfg.num_cpus!r}")
    for name, amount in cfg.resources.items():
        if not isinstance(amount, int | float) or not math.isfinite(amount) or amount < 0:
            raise ConfigError(f"runner.ray.resources.{name} must be a number >= 0, got {amount!r}")
    if cfg.local_cpus is not None and cfg.local_cpus < 1:
        raise ConfigError(f"runner.ray.local_cpus must be at least 1, got {cfg.local_cpus}")
    if cfg.address is not None and not (cfg.address == "auto" or ":" in cfg.address):
        raise ConfigError(f"runner.ray.address must be 'auto', HOST:PORT or ray://HOST:PORT, got {cfg.address!r}")
    check_ray_installed()


def check_ray_installed() -> None:
    """ConfigError naming the extra to install when Ray is missing; finds Ray without importing it
    (an import takes seconds), so a config check stays cheap."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"runner.backend=ray needs Ray, which is not installed: {RAY_EXTRA}")


def import_ray() -> Any:
    """The `ray` module, or a one-line ConfigError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"runner.backend=ray needs Ray, which is not installed: {RAY_EXTRA}") from None
    return ray


def connect(cfg: RayConfig) -> tuple[Any, bool, str | None]:
    """The `ray` module, initialised: as it is when this process already joined Ray, else joining
    `cfg.address` (None: a new local cluster of `cfg.local_cpus` CPUs, or the one RAY_ADDRESS
    names). Also whether this call initialised Ray (so its caller shuts it down), and the Ray
    dashboard's URL when this call started or joined a cluster that runs one."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False, None
    kwargs: dict[str, Any] = {"address": cfg.address, "log_to_driver": True, "configure_logging": False}
    if cfg.address is None:
        kwargs["num_cpus"] = cfg.local_cpus
    try:
        context = ray.init(**kwargs)
    except (ConnectionError, ValueError, RuntimeError) as err:
        where = "start a local Ray cluster" if cfg.address is None else f"join the Ray cluster at {cfg.address}"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"cannot {where}: {first}") from None
    url = getattr(context, "dashboard_url", None) or None
    if url and not str(url).startswith("http"):
        url = f"http://{url}"
    logger.info("ray runner pool: Ray %s; dashboard %s", cfg.address or "started locally", url or "not running")
    return ray, True, url


def actor_options(cfg: RayConfig) -> dict[str, Any]:
    """`ray.remote` options for a runner actor: what it reserves and where it may go. Ray never
    restarts it itself (max_restarts=0): the pool records its attempt and replaces it."""
    options: dict[str, Any] = {"num_cpus": cfg.num_cpus, "max_restarts": 0}
    if cfg.resources:
        options["resources"] = dict(cfg.resources)
    if cfg.label_selector:
        options["label_selector"] = dict(cfg.label_selector)
    if cfg.spread:
        options["scheduling_strategy"] = "SPREAD"
    return options


def check_capacity(ray: Any, cfg: RayConfig, n_runners: int) -> None:
    """ConfigError when no live node (with the labels asked for) could hold even one actor; a
    warning when the cluster cannot hold all `n_runners` now (an autoscaler may add nodes)."""
    need = {"CPU": cfg.num_cpus, **cfg.resources}
    labels = cfg.label_selector
    nodes = [
        node.get("Resources", {})
        for node in ray.nodes()
        if node.get("Alive") and all(node.get("Labels", {}).get(key) == value for key, value in labels.items())
    ]
    fits = [
        min(res.get(key, 0.0) / amount if amount else float("inf") for key, amount in need.items()) for res in nodes
    ]
    if not any(fit >= 1 for fit in fits):
        wanted = ", ".join(f"{key}={amount:g}" for key, amount in need.items())
        where = f" with labels {labels}" if labels else ""
        raise ConfigError(
            f"no node of the Ray cluster{where} can hold a runner actor needing {wanted}: "
            "lower runner.ray.num_cpus or runner.ray.resources, or add nodes that have them"
        )
    if sum(int(fit) for fit in fits) < n_runners:
        logger.warning("ray runner pool: the cluster holds fewer than %d runner actors now", n_runners)
