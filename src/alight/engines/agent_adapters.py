"""One LoRA adapter per agent on the embedded engine's model (per-agent LoRA).

The engine's model becomes a peft model holding one named adapter per agent on the shared base.
A call is answered by the adapter of its agent: the model name `{served_name}/{agent}` picks it
explicitly, else the call's agent (the proxy's `x-alight-agent` header or agent route); a call from
any other agent gets the base model (adapters disabled). A batch is generated with one adapter
active: the engine groups queued calls by adapter, never mixing them in one forward pass.

Adapters come from `{model_dir}/adapters/{agent}/` when the model directory holds them (a training
checkpoint), else they are created from `lora` (peft `LoraConfig` keyword arguments) with peft's
initialisation, whose B matrix is zero: such an adapter answers exactly as the base does until the
trainer sends its weights.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from alight.errors import ConfigError
from alight.models.lora_layout import (
    ADAPTERS_DIR,
    adapter_file,
    check_adapter_names,
    plain_name,
    saved_adapters,
)

__all__ = ["ADAPTERS_DIR", "AgentAdapters", "check_adapter_names", "saved_adapters"]


class AgentAdapters:
    """The per-agent adapters of one engine (see the module docstring)."""

    def __init__(self, names: list[str], lora: Mapping[str, Any] | None, served_name: str) -> None:
        check_adapter_names(list(names), "embedded engine: adapters")
        self.names = list(names)
        self.lora = dict(lora) if lora is not None else None
        self.served_name = served_name

    @property
    def model_names(self) -> list[str]:
        """`{served_name}/{agent}` for every adapter."""
        return [f"{self.served_name}/{name}" for name in self.names]

    def adapter_for(self, model: str, agent: str | None) -> str | None:
        """The adapter that answers a call for `model` made by `agent` (None: the base model)."""
        prefix = f"{self.served_name}/"
        if model.startswith(prefix) and model[len(prefix) :] in self.names:
            return model[len(prefix) :]
        return agent if agent in self.names else None

    def attach(self, model: Any, model_dir: str | os.PathLike[str]) -> Any:
        """The peft model holding every adapter on `model` (saved ones loaded), in eval mode."""
        from peft import LoraConfig, PeftModel, get_peft_model

        root = Path(model_dir) / ADAPTERS_DIR
        saved = set(saved_adapters(model_dir))
        missing = [n for n in self.names if n not in saved]
        if missing and self.lora is None:
            raise ConfigError(f"embedded engine: no adapter for {missing[0]!r} in {root} and no lora settings")
        peft_model: Any = None
        try:
            for name in self.names:
                if name in saved and peft_model is None:
                    peft_model = PeftModel.from_pretrained(model, root / name, adapter_name=name)
                elif name in saved:
                    peft_model.load_adapter(root / name, adapter_name=name)
                elif peft_model is None:
                    peft_model = get_peft_model(model, LoraConfig(**(self.lora or {})), adapter_name=name)
                else:
                    peft_model.add_adapter(name, LoraConfig(**(self.lora or {})))
        except (TypeError, ValueError) as err:
            raise ConfigError(f"embedded engine: cannot build the adapters: {str(err).splitlines()[0]}") from None
        peft_model.requires_grad_(False)
        return peft_model.eval()

    @contextlib.contextmanager
    def active(self, model: Any, adapter: str | None) -> Iterator[None]:
        """`adapter` answers inside (None: the base model, adapters disabled). Worker thread only."""
        if adapter is None:
            with model.disable_adapter():
                yield
            return
        model.set_adapter(adapter, inference_mode=True)  # inference mode: the adapter stays frozen
        yield

    def load(self, model: Any, weights: Mapping[str, Any] | str | os.PathLike[str]) -> None:
        """Copy new weights into the peft model in place: a (partial) state dict under the peft
        model's own names (what the per-agent backend sends: every adapter's tensors), or a model
        directory (its base weights, and the adapters it holds).

        Raises:
            ConfigError: a key the model does not have or a shape mismatch (nothing is copied then).
        """
        import torch

        own = model.state_dict()
        if isinstance(weights, str | os.PathLike):
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            from alight.engines.weights import read_checkpoint

            plain = {plain_name(k): k for k in own if "lora_" not in k}
            state = {plain.get(k, k): v for k, v in read_checkpoint(weights).items()}
            _check_fits(own, state)
            with torch.no_grad():
                for key, value in state.items():
                    own[key].copy_(value)
            for name in saved_adapters(weights):
                if name in self.names:
                    adapter = load_file(str(adapter_file(weights, name)))
                    set_peft_model_state_dict(model, adapter, adapter_name=name)
            return
        state = dict(weights)
        _check_fits(own, state)
        with torch.no_grad():
            for key, value in state.items():
                own[key].copy_(value)


def _check_fits(own: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    unknown = sorted(set(state) - set(own))
    wrong = sorted(k for k in state if k in own and tuple(state[k].shape) != tuple(own[k].shape))
    if unknown or wrong:
        details = [
            f"{label}: {', '.join(keys[:3])}" for label, keys in (("unknown", unknown), ("wrong shape", wrong)) if keys
        ]
        raise ConfigError(f"the weights do not fit the adapters' model ({'; '.join(details)})")
