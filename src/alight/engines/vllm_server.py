"""A `vllm serve` process: its command line, start-up, health checks, weight files and shutdown.

The process serves a directory the engine owns (links to the model's files), so new weights can
be written there and reloaded from disk without touching the user's model directory.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

INSTALL_HINT = 'the vllm engine needs vLLM: pip install "alight[vllm]"'
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model*.bin.index.json")


def vllm_executable() -> list[str]:
    """The command that runs vLLM's CLI. Raises ConfigError naming the extra when vLLM is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(INSTALL_HINT)
    local = Path(sys.executable).parent / "vllm"
    found = str(local) if local.is_file() else shutil.which("vllm")
    if found is None:
        raise ConfigError(f"vLLM is importable but its `vllm` command is not on PATH; {INSTALL_HINT}")
    return [found]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def serve_command(
    executable: Sequence[str],
    model_dir: str | os.PathLike[str],
    *,
    host: str,
    port: int,
    served_name: str,
    gpu_memory_utilization: float,
    dtype: str = "auto",
    max_model_len: int | None = None,
    seed: int | None = 0,
    logprobs_mode: str | None = "processed_logprobs",
    sleep_mode: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The `vllm serve` command line (extra_args last, so they can override anything). `sleep_mode`
    adds `--enable-sleep-mode`, so the server can free its GPU memory on `POST /sleep`."""
    cmd = [*executable, "serve", str(model_dir), "--host", host, "--port", str(port)]
    cmd += ["--served-model-name", served_name, "--gpu-memory-utilization", str(gpu_memory_utilization)]
    cmd += ["--dtype", dtype]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if logprobs_mode:
        cmd += ["--logprobs-mode", logprobs_mode]
    if sleep_mode:
        cmd += ["--enable-sleep-mode"]
    return cmd + list(extra_args)


def link_model_dir(source: Path, target: Path) -> Path:
    """Fill `target` with links to every file of the model directory `source` (fresh each time)."""
    if not (source / "config.json").is_file():
        raise ConfigError(f"vllm engine: {source} is not a model directory (no config.json)")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file():
            (target / path.name).symlink_to(path.resolve())
    return target


def write_weights(target: Path, weights: Mapping[str, Any] | str | os.PathLike[str]) -> None:
    """Replace the weight files of the served directory with `weights` (a state dict or checkpoint)."""
    if isinstance(weights, str | os.PathLike):
        source = Path(weights)
        files = [p for pattern in WEIGHT_PATTERNS for p in source.glob(pattern)] if source.is_dir() else [source]
        if not files or not all(p.is_file() for p in files):
            raise ConfigError(f"no weights (*.safetensors or pytorch_model*.bin) at {source}")
    for pattern in WEIGHT_PATTERNS:
        for old in target.glob(pattern):
            old.unlink()
    if isinstance(weights, str | os.PathLike):
        for path in files:
            shutil.copyfile(path, target / path.name)
        return
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, tensor in weights.items():
        if tensor.data_ptr() in seen:  # tied weights (lm_head = embeddings): safetensors stores one copy
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().contiguous().cpu()
    tmp = target / ".model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, target / "model.safetensors")


class VLLMProcess:
    """One `vllm serve` child process with its log file."""

    def __init__(self, command: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.command, self.log_path = command, log_path
        self.env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        logger.info("starting %s (log: %s)", " ".join(self.command), self.log_path)
        # its own session, so stopping it also stops the engine-core processes it spawns
        self._proc = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def wait_healthy(self, url: str, timeout_s: float) -> None:
        """Poll `url` (/health) until it answers 200. Raises ConfigError if the process exits first,
        TimeoutError when it is not up in time."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.returncode is not None:
                raise ConfigError(f"vllm serve exited with code {self.returncode} while starting; see {self.log_path}")
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vllm serve did not become healthy in {timeout_s:.0f} s; see {self.log_path}")

    def stop(self, grace_s: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
