"""Per-agent LoRA on the real tiny model: each adapter learns only from its own agent's rows, with
its own optimizer and learning-rate schedule; checkpoints round-trip every adapter, optimizer and
schedule; the factory picks the backend and the engine options it states; the embedded engine
answers each agent with its adapter; bad settings are one-line errors (exit code 2 from the CLI)."""

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
from alight.backends.embedded import EmbeddedBackend
from alight.backends.factory import backend_for, check_backend
from alight.backends.per_agent_lora import PerAgentLoraBackend
from alight.config.schema import (
    AlgorithmConfig,
    DataConfig,
    EngineConfig,
    ExperimentConfig,
    LoraConfig,
    TrainerConfig,
)
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
    steps = {a: [s["step"] for s in o.optimizer.state.values()] for a, o in policy.optimizers.items()}
    assert all(values and all(int(v) == 1 for v in values) for values in steps.values()), steps
    both = policy.update(batch("writer", "rewriter"))
    assert both["actor/optimizer_steps"] == 2 and both["actor/agents_updated"] == 2
    assert both["actor/loss"] == pytest.approx((both["actor/writer/loss"] + both["actor/rewriter/loss"]) / 2)


def test_with_unequal_rows_each_agent_s_metrics_are_its_own_and_the_totals_weigh_agents_by_rows(
    tiny_dir: Path,
) -> None:
    """Three writer rows, one rewriter row and one row of an agent without an adapter. The adapters
    start as the base (LoRA's B is 0) and the old log-probs are the policy's, so every ratio is 1
    and an agent's token-mean loss is -sum(A * response length) / its response tokens, by hand:
    writer -(2 + 3 - 4) / 9, rewriter +2 / 2. The totals weigh the agents by rows ((3 x -1/9 + 1)
    / 4 = 1/6, not their plain mean 4/9 nor the mixed rows' -1/11), counts and tokens add up."""
    shapes = [("writer", 1.0, 2), ("writer", 1.0, 3), ("nobody", 1.0, 5), ("rewriter", -1.0, 2), ("writer", -1.0, 4)]
    rows = [
        Transition.unchecked([5, 6, 7 + i], list(range(20, 20 + n)), 1.0, f"ro-{i}", advantage=a, agent_name=agent)
        for i, (agent, a, n) in enumerate(shapes)
    ]
    metrics = backend(tiny_dir).update(TransitionBatch.from_transitions(rows, 0))
    assert metrics["actor/writer/rows"] == 3 and metrics["actor/rewriter/rows"] == 1
    assert metrics["actor/rows_without_adapter"] == 1 and metrics["actor/agents_updated"] == 2
    assert metrics["actor/writer/loss"] == pytest.approx(-1 / 9, abs=1e-5)
    assert metrics["actor/rewriter/loss"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/loss"] == pytest.approx(1 / 6, abs=1e-5)
    # tokens forwarded (prompt + response): each agent's own rows, the total their sum
    assert metrics["actor/writer/update_tokens"] == 3 * 3 + 2 + 3 + 4
    assert metrics["actor/rewriter/update_tokens"] == 3 + 2
    assert metrics["actor/update_tokens"] == 9 + 9 + 5
    assert metrics["actor/optimizer_steps"] == 2
    for name in ("entropy", "pg_clipfrac", "lr"):  # a per-token or per-step mean: weighted by rows
        expected = (3 * metrics[f"actor/writer/{name}"] + metrics[f"actor/rewriter/{name}"]) / 4
        assert metrics[f"actor/{name}"] == pytest.approx(expected), name


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


#: Updates of the two runs below: the writer's adapter three times, the rewriter's once.
UPDATES = (("writer",), ("writer", "rewriter"), ("writer",))
#: algorithm.warmup_steps=4 at lr 1e-2: after n steps of its own an adapter's lr is 1e-2 * (n + 1) / 5.
WARMUP = 4


def test_each_adapter_warms_up_on_its_own_updates_only(tiny_dir: Path) -> None:
    policy = backend(tiny_dir, warmup_steps=WARMUP)
    used: dict[str, list[float]] = {a: [] for a in AGENTS}
    for agents in UPDATES:
        metrics = policy.update(batch(*agents))
        for agent in agents:
            used[agent].append(metrics[f"actor/{agent}/lr"])
    # the lr each step used: its own step 0, 1, 2 for the writer, step 0 for the rewriter
    assert used == {"writer": pytest.approx([2e-3, 4e-3, 6e-3]), "rewriter": pytest.approx([2e-3])}
    # what AdamW applies next, read from its parameter groups
    next_lr = {a: policy.optimizers[a].optimizer.param_groups[0]["lr"] for a in AGENTS}
    assert next_lr == {"writer": pytest.approx(8e-3), "rewriter": pytest.approx(4e-3)}


def test_a_resumed_run_restores_every_adapter_optimizer_and_schedule(tiny_dir: Path, tmp_path: Path) -> None:
    first = backend(tiny_dir, warmup_steps=WARMUP)
    for agents in UPDATES:
        first.update(batch(*agents))
    first.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt" / "adapters").iterdir() if p.is_dir()) == sorted(AGENTS)
    second = backend(tiny_dir, warmup_steps=WARMUP)
    second.load(tmp_path / "ckpt")
    for agent in AGENTS:
        assert same(first.adapter_tensors(agent), second.adapter_tensors(agent))
    next_lr = {a: second.optimizers[a].optimizer.param_groups[0]["lr"] for a in AGENTS}
    assert next_lr == {"writer": pytest.approx(8e-3), "rewriter": pytest.approx(4e-3)}  # as in the run above
    # resuming is exact: the same next update gives the same metrics and adapters (moments, lrs restored)
    assert first.update(batch("rewriter", "writer")) == second.update(batch("rewriter", "writer"))
    for agent in AGENTS:
        assert same(first.adapter_tensors(agent), second.adapter_tensors(agent))


def test_the_factory_picks_the_backend_and_asks_it_for_the_engine_options() -> None:
    lora = LoraConfig(per_agent=True, agents=AGENTS, r=4)
    per_agent = ExperimentConfig(algorithm=AlgorithmConfig(lora=lora))
    assert backend_for(per_agent) is PerAgentLoraBackend
    options = backend_for(per_agent).engine_options(per_agent)
    assert options == {
        "adapters": AGENTS,
        "lora": {
            "r": 4,
            "lora_alpha": 16,
            "lora_dropout": 0.0,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            "task_type": "CAUSAL_LM",
        },
    }
    plain = ExperimentConfig(algorithm=AlgorithmConfig(lora=LoraConfig(enabled=True)))
    assert backend_for(plain) is EmbeddedBackend and backend_for(plain).engine_options(plain) == {}
    verl = ExperimentConfig(trainer=TrainerConfig(backend="verl"))
    assert backend_for(verl).__name__ == "VerlBackend" and backend_for(verl).engine_options(verl) == {}


def test_the_engine_answers_each_agent_with_its_adapter(tiny_dir: Path, tmp_path: Path) -> None:
    """A checkpoint served the way `alight serve` does: `policy` is the base, `policy/{agent}` and
    calls tagged with an agent get that agent's adapter; log-probs match a forward pass of the
    base with that adapter merged in by hand."""
    import shutil

    from alight.engines.base import ChatRequest, SamplingParams
    from alight.models.resolve import resolve_model

    policy = backend(tiny_dir)
    policy.update(batch("writer"))
    policy.update(batch("rewriter", "rewriter"))
    directory = tmp_path / "ckpt"
    policy.save(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, directory / name)
    from alight.engines.agent_adapters import saved_adapters
    from alight.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(
        resolve_model(str(directory), checkpoints=True), adapters=saved_adapters(directory), served_name="policy"
    )
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
        ({"data": DataConfig(from_store="runs/x")}, "not with data.from_store"),
    ],
)
def test_settings_that_cannot_run_are_one_line_errors(change: dict[str, Any], expected: str) -> None:
    lora = change.pop("lora", LoraConfig(per_agent=True, agents=AGENTS))
    cfg = ExperimentConfig(algorithm=AlgorithmConfig(lora=lora), **change)
    with pytest.raises(ConfigError, match=expected) as err:
        check_backend(cfg)
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
