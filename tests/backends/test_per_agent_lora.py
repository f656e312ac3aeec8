"""Per-agent LoRA on the real tiny model: each adapter learns only from its own agent's rows, with
its own optimizer; checkpoints round-trip every adapter and optimizer; the embedded engine answers
each agent with its adapter; bad settings are one-line errors (exit code 2 from the CLI)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from alight.algorithms.batch import TransitionBatch
from alight.backends.per_agent_lora import PerAgentLoraBackend, check_per_agent
from alight.config.schema import AlgorithmConfig, EngineConfig, ExperimentConfig, LoraConfig, TrainerConfig
from alight.errors import ConfigError
from alight.types import Transition

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]
AGENTS = ["writer", "rewriter"]


def backend(tiny_dir: Path, **algorithm: Any) -> PerAgentLoraBackend:
    lora = LoraConfig(per_agent=True, agents=AGENTS)
    return PerAgentLoraBackend(tiny_dir, AlgorithmConfig(lr=1e-2, lora=lora, **algorithm))


def batch(*agents: str) -> TransitionBatch:
    """Two rows per agent named, with opposite advantages (so every row has a gradient)."""
    rows = []
    for i, agent in enumerate(agents):
        rows.append(Transition.unchecked([5, 6, 7 + i], [8, 9], 1.0, f"ro-{i}", advantage=1.0, agent_name=agent))
        rows.append(Transition.unchecked([5, 6], [10, 11 + i, 12], 0.0, f"ro-{i}", advantage=-1.0, agent_name=agent))
    return TransitionBatch.from_transitions(rows, 0)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    assert a.keys() == b.keys() and a
    return all(torch.equal(a[k], b[k]) for k in a)


def test_an_update_moves_only_the_adapters_of_the_agents_in_the_batch(tiny_dir: Path) -> None:
    # weight decay would move an adapter that takes an optimizer step without gradients: it must take none
    policy = backend(tiny_dir, weight_decay=0.1)
    for trained, other in (("writer", "rewriter"), ("rewriter", "writer")):
        before = {a: policy.adapter_tensors(a) for a in AGENTS}
        metrics = policy.update(batch(trained, "nobody"))
        assert same(before[other], policy.adapter_tensors(other))
        assert not same(before[trained], policy.adapter_tensors(trained))
        assert metrics[f"actor/{trained}/rows"] == 2 and f"actor/{other}/rows" not in metrics
        assert metrics["actor/rows_without_adapter"] == 2 and metrics["actor/optimizer_steps"] == 1
    # each adapter has its own AdamW: one step each so far
    steps = {a: [s["step"] for s in opt.state.values()] for a, (opt, _) in policy.optimizers.items()}
    assert all(values and all(int(v) == 1 for v in values) for values in steps.values()), steps
    both = policy.update(batch("writer", "rewriter"))
    assert both["actor/optimizer_steps"] == 2 and both["actor/agents_updated"] == 2
    assert both["actor/loss"] == pytest.approx((both["actor/writer/loss"] + both["actor/rewriter/loss"]) / 2)


def test_the_base_model_never_changes_and_is_the_kl_reference(tiny_dir: Path) -> None:
    from safetensors.torch import load_file

    policy = backend(tiny_dir, kl_coef=0.5)
    policy.update(batch("writer"))
    metrics = policy.update(batch("writer"))
    assert metrics["actor/kl"] > 0  # the second update is away from the base (adapters disabled)
    original = load_file(str(tiny_dir / "model.safetensors"))
    weights = {
        k.removeprefix("base_model.model.").replace(".base_layer.", "."): v
        for k, v in policy.model.state_dict().items()
    }
    assert all(torch.equal(original[k], weights[k]) for k in original)


def test_a_checkpoint_restores_every_adapter_and_optimizer(tiny_dir: Path, tmp_path: Path) -> None:
    first = backend(tiny_dir)
    first.update(batch("writer", "rewriter"))
    first.update(batch("writer"))
    first.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt" / "adapters").iterdir() if p.is_dir()) == sorted(AGENTS)
    second = backend(tiny_dir)
    second.load(tmp_path / "ckpt")
    for agent in AGENTS:
        assert same(first.adapter_tensors(agent), second.adapter_tensors(agent))
    # resuming is exact: the same next update gives the same adapters (optimizer moments restored)
    first.update(batch("rewriter", "writer"))
    second.update(batch("rewriter", "writer"))
    for agent in AGENTS:
        assert same(first.adapter_tensors(agent), second.adapter_tensors(agent))


def test_the_engine_answers_each_agent_with_its_adapter(tiny_dir: Path, tmp_path: Path) -> None:
    """A checkpoint served the way `alight serve` does: `policy` is the base, `policy/{agent}` and
    calls tagged with an agent get that agent's adapter; log-probs match a forward pass of the
    base with that adapter merged in by hand."""
    import shutil

    from alight.engines.base import ChatRequest, SamplingParams
    from alight.trainer.serve import resolve_model

    policy = backend(tiny_dir)
    policy.update(batch("writer"))
    policy.update(batch("rewriter", "rewriter"))
    directory = tmp_path / "ckpt"
    policy.save(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, directory / name)
    from alight.engines.agent_adapters import saved_adapters
    from alight.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(resolve_model(str(directory)), adapters=saved_adapters(directory), served_name="policy")
    assert engine.model_names[-2:] == ["policy/rewriter", "policy/writer"]
    weights = {a: policy.adapter_tensors(a) for a in AGENTS}

    async def ask(model: str, agent: str | None) -> Any:
        request = ChatRequest(model, [{"role": "user", "content": "Tom has 12 pens."}], agent=agent)
        request.sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
        return await engine.chat(request)

    async def answers() -> list[Any]:
        try:
            return [await ask(*call) for call in (("policy", "writer"), ("policy/rewriter", None), ("policy", "x"))]
        finally:
            await engine.close()

    writer, rewriter, base = asyncio.run(answers())
    assert (writer.adapter, rewriter.adapter, base.adapter) == ("writer", "rewriter", None)
    for generation, agent in ((writer, "writer"), (rewriter, "rewriter"), (base, None)):
        expected = hand_merged_log_probs(tiny_dir, weights.get(agent or "", {}), agent, generation)
        assert torch.allclose(torch.tensor(generation.response_logprobs), expected, atol=1e-4)
    other = hand_merged_log_probs(tiny_dir, weights["rewriter"], "rewriter", writer)
    assert (other - torch.tensor(writer.response_logprobs)).abs().max() > 1e-3


def hand_merged_log_probs(tiny_dir: Path, adapter: dict[str, torch.Tensor], agent: str | None, generation: Any) -> Any:
    """Log-probs of a generation's response under the base with W += (alpha / r) B A of `agent`."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    state = model.state_dict()
    scale = LoraConfig().alpha / LoraConfig().r
    for key, a in adapter.items():
        if ".lora_A." in key:
            module = key.removeprefix("base_model.model.").split(".lora_A.")[0]
            state[f"{module}.weight"] += scale * adapter[key.replace(".lora_A.", ".lora_B.")] @ a
    model.load_state_dict(state)
    prompt, response = generation.prompt_token_ids, generation.response_token_ids
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"lora": LoraConfig(per_agent=True)}, "needs algorithm.lora.agents"),
        ({"lora": LoraConfig(per_agent=True, agents=["a.b"])}, "not a usable adapter name"),
        ({"lora": LoraConfig(per_agent=True, agents=["w", "w"])}, "names an agent twice"),
        ({"lora": LoraConfig(agents=["w"])}, "per_agent is false"),
        ({"trainer": TrainerConfig(backend="verl")}, "not yet with trainer.backend=verl"),
        ({"engine": EngineConfig(kind="vllm")}, "not yet with engine.kind=vllm"),
    ],
)
def test_settings_that_cannot_run_are_one_line_errors(change: dict[str, Any], expected: str) -> None:
    lora = change.pop("lora", LoraConfig(per_agent=True, agents=AGENTS))
    cfg = ExperimentConfig(algorithm=AlgorithmConfig(lora=lora), **change)
    with pytest.raises(ConfigError, match=expected) as err:
        check_per_agent(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_the_cli_refuses_per_agent_lora_on_verl_with_exit_code_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", "NO_COLOR": "1"}
    for override, expected in (
        ("trainer.backend=verl", "not yet with trainer.backend=verl"),
        ("algorithm.lora.agents=[]", "needs algorithm.lora.agents"),
    ):
        args = ["configs/calc_two_agents.yaml", override, f"trainer.output_dir={tmp_path}", "--no-dashboard"]
        done = subprocess.run(
            [sys.executable, "-m", "alight", "train", *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=120,
        )
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert expected in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
