"""A prompt several rows share runs once (alight.backends.shared_prompt): the same log-probs, entropy
and gradients as one forward over every row, and the same update; rows that share nothing, or a
model in gradient checkpointing, take the plain forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from alight.algorithms.batch import TransitionBatch
from alight.backends import shared_prompt
from alight.backends.embedded import EmbeddedBackend
from alight.config.schema import AlgorithmConfig, LoraConfig
from alight.types import Transition
from tests.backends.test_chunked import plain

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAD = 0


def grouped(seed: int = 0) -> TransitionBatch:
    """Two groups of three rows sharing a prompt, one row alone, and a row whose prompt is another's
    minus its first token (so its left padding differs): responses of 1..9 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 250, (n,), generator=g).tolist() for n in (7, 4, 5)]
    prompts.append(prompts[0][1:])
    rows = []
    for i, prompt in enumerate([0, 0, 0, 1, 1, 1, 2, 3]):
        response = torch.randint(1, 250, (1 + (4 * i) % 9,), generator=g).tolist()
        advantage = float(torch.randn((), generator=g))
        rows.append(Transition.unchecked(prompts[prompt], response, 1.0, f"ro-{i}", group_id="g", advantage=advantage))
    return TransitionBatch.from_transitions(rows, PAD)


def headed(seed: int = 0, header: int = 20) -> TransitionBatch:
    """Five distinct prompts that start with the same `header` tokens (a system prompt), one of
    them sampled three times, with questions of 1..6 tokens after the header."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(1, 250, (header,), generator=g).tolist()
    prompts = [head + torch.randint(1, 250, (n,), generator=g).tolist() for n in (1, 6, 3, 4, 2)]
    rows = []
    for i, prompt in enumerate([0, 1, 2, 2, 2, 3, 4]):
        response = torch.randint(1, 250, (2 + (3 * i) % 7,), generator=g).tolist()
        advantage = float(torch.randn((), generator=g))
        rows.append(Transition.unchecked(prompts[prompt], response, 1.0, f"ro-{i}", group_id="g", advantage=advantage))
    return TransitionBatch.from_transitions(rows, PAD)


def decoder_rows(b: EmbeddedBackend, batch: TransitionBatch) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """The (rows, tokens) of each decoder call of one log-prob forward, and its log-probs."""
    calls: list[tuple[int, int]] = []
    hook = b.model.get_decoder().register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    lp, _ = b.log_probs(batch)
    hook.remove()
    return calls, lp


def test_common_prefix_is_the_shared_head_of_left_padded_rows() -> None:
    batch = headed()
    assert shared_prompt.common_prefix(batch.prompts, batch.prompt_lengths) == 20
    one = batch.select([0])  # 21 tokens alone: nothing to share
    assert shared_prompt.common_prefix(one.prompts, one.prompt_lengths) == 0
    nested = prefixes_of_each_other()  # a prompt that is another's start keeps one token its own
    assert shared_prompt.common_prefix(nested.prompts, nested.prompt_lengths) == 19


def prefixes_of_each_other() -> TransitionBatch:
    g = torch.Generator().manual_seed(5)
    long = torch.randint(1, 250, (26,), generator=g).tolist()
    rows = [
        Transition.unchecked(
            long[:n], torch.randint(1, 250, (3 + i,), generator=g).tolist(), 1.0, f"r{i}", advantage=1.0
        )
        for i, n in enumerate((20, 26, 23, 20))
    ]
    return TransitionBatch.from_transitions(rows, PAD)


def test_prompts_that_start_one_another_give_the_plain_forwards_log_probs(tiny_dir: Path) -> None:
    batch = prefixes_of_each_other()
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(), seed=0)
    calls, lp = decoder_rows(b, batch)
    assert calls[:2] == [(1, 19), (3, 7)] and sum(rows for rows, _ in calls[2:]) == 4
    want_lp, _ = plain(b.model, batch, 1.0)
    assert torch.allclose(lp, want_lp, atol=2e-5, rtol=0), (lp - want_lp).abs().max()


@pytest.mark.parametrize("header", [20, 40])
def test_a_shared_header_runs_once_then_each_prompt_then_the_responses(tiny_dir: Path, header: int) -> None:
    batch = headed(seed=header, header=header)
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(log_prob_chunk=4), temperature=1.0, seed=0)
    params = [p for p in b.model.parameters() if p.requires_grad]
    calls, lp = decoder_rows(b, batch)
    assert calls[:2] == [(1, header), (5, 6)]
    assert sum(rows for rows, _ in calls[2:]) == 7 and all(width <= batch.response_length for _, width in calls[2:])
    weights = torch.randn(batch.responses.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((lp * weights).sum(), params)
    want_lp, _ = plain(b.model, batch, 1.0)
    want_grads = torch.autograd.grad((want_lp * weights).sum(), params)
    assert torch.allclose(lp, want_lp, atol=2e-5, rtol=0), (lp - want_lp).abs().max()
    for got, want in zip(grads, want_grads, strict=True):
        assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


def test_a_short_shared_head_and_distinct_prompts_take_the_plain_forward(tiny_dir: Path) -> None:
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(), seed=0)
    short = headed(header=shared_prompt.MIN_SHARED_PREFIX - 1).select([0, 1, 2, 5, 6])  # distinct prompts
    calls, _ = decoder_rows(b, short)
    assert calls == [(5, short.input_ids.shape[1])]


def test_prompt_groups_are_rows_with_equal_prompt_ids() -> None:
    batch = grouped()
    groups = shared_prompt.prompt_groups(batch)
    assert groups is not None
    first, row_prompt = groups
    assert len(first) == 4  # the two groups, the lone row, the shorter prompt
    assert row_prompt[:3].unique().numel() == 1 and row_prompt[3:6].unique().numel() == 1
    assert len({int(row_prompt[i]) for i in (0, 3, 6, 7)}) == 4
    for row in range(len(batch)):  # each row's prompt is its group's first row's
        assert torch.equal(batch.prompts[first[row_prompt[row]]], batch.prompts[row])
    alone = batch.select([0, 3, 6, 7])
    assert shared_prompt.prompt_groups(alone) is None
    assert shared_prompt.prompt_groups(batch.select([0])) is None


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompts_give_the_plain_forwards_log_probs_and_gradients(tiny_dir: Path, lora: bool) -> None:
    batch = grouped(seed=1)
    lora_cfg = LoraConfig(enabled=lora, target_modules=["q_proj", "v_proj", "up_proj"])
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(log_prob_chunk=5, lora=lora_cfg), temperature=0.8, seed=0)
    if lora:
        with torch.no_grad():
            for name, p in b.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    params = [p for p in b.model.parameters() if p.requires_grad]
    calls: list[int] = []
    decoder = b.model.get_decoder()
    hook = decoder.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    lp, ent = b.log_probs(batch, entropy=True)
    hook.remove()
    assert calls[0] == 4 and sum(calls[1:]) == 8  # the 4 distinct prompts once, then the 8 responses
    assert 1 <= len(calls[1:]) <= shared_prompt.MAX_BUCKETS  # in groups of similar length
    assert ent is not None
    weights = torch.randn(batch.responses.shape, generator=torch.Generator().manual_seed(0))
    grads = torch.autograd.grad((lp * weights).sum() + ent.sum(), params)
    want_lp, want_ent = plain(b.model, batch, 0.8)
    want_grads = torch.autograd.grad((want_lp * weights).sum() + want_ent.sum(), params)
    assert torch.allclose(lp, want_lp, atol=2e-5, rtol=0), (lp - want_lp).abs().max()
    assert torch.allclose(ent, want_ent, atol=2e-5, rtol=0)
    for got, want in zip(grads, want_grads, strict=True):
        assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


def test_an_update_with_shared_prompts_is_the_plain_update(tiny_dir: Path) -> None:
    batch = grouped(seed=2)
    results = []
    for share in (True, False):
        b = EmbeddedBackend(tiny_dir, AlgorithmConfig(lr=1e-3, micro_batch_size=3, share_prompts=share), seed=0)
        results.append(b.update(batch))
    shared, unshared = results  # (AdamW's first step is lr * sign(g) for any g: compare before it)
    for key in ("actor/loss", "actor/entropy", "actor/ppo_kl", "actor/grad_norm"):
        assert shared[key] == pytest.approx(unshared[key], rel=1e-4, abs=1e-6), key
    assert shared["actor/update_tokens"] == unshared["actor/update_tokens"]


def test_gradient_checkpointing_and_sliding_windows_take_the_plain_forward(tiny_dir: Path) -> None:
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(gradient_checkpointing=True), seed=0)
    assert not shared_prompt.shareable(b.model)
    calls: list[int] = []
    hook = b.model.get_decoder().register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    b.log_probs(grouped())
    hook.remove()
    assert calls == [8]
    plain_b = EmbeddedBackend(tiny_dir, AlgorithmConfig(), seed=0)
    assert shared_prompt.shareable(plain_b.model)
    plain_b.model.config.layer_types = ["sliding_attention"] * len(plain_b.model.config.layer_types)
    assert not shared_prompt.shareable(plain_b.model)


def test_response_buckets_pad_each_group_to_its_own_longest() -> None:
    lengths = [3, 60, 2, 58, 4, 61, 3]
    groups = shared_prompt.response_buckets(lengths, most=4, overhead=8)
    assert sorted(row for group in groups for row in group) == list(range(7))  # every row once
    assert groups == [[0, 2, 4, 6], [1, 3, 5]]  # short and long apart: 4 x 4 + 3 x 61 + 2 x 8
    assert shared_prompt.response_buckets(lengths, most=1) == [list(range(7))]
    assert shared_prompt.response_buckets(lengths, most=4, overhead=10_000) == [list(range(7))]
    assert shared_prompt.response_buckets([5] * 6) == [list(range(6))]
    assert shared_prompt.response_buckets([]) == []


def test_responses_of_very_different_lengths_run_in_groups_with_the_plain_values(tiny_dir: Path) -> None:
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(1, 250, (9,), generator=g).tolist()
    lengths = [2, 70, 3, 66, 2, 71]  # interleaved: a group's rows are not consecutive rows of the batch
    rows = [
        Transition.unchecked(prompt, torch.randint(1, 250, (n,), generator=g).tolist(), 1.0, f"r{i}", advantage=1.0)
        for i, n in enumerate(lengths)
    ]
    batch = TransitionBatch.from_transitions(rows, PAD)
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(), seed=0)
    calls, lp = decoder_rows(b, batch)
    assert calls == [(1, 9), (3, 3), (3, 71)]  # the prompt once, then the short and the long responses
    want_lp, _ = plain(b.model, batch, 1.0)
    assert torch.allclose(lp, want_lp, atol=2e-5, rtol=0), (lp - want_lp).abs().max()
