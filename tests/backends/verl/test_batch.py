"""`to_data_proto` and the row padding: checked against verl's own functions on real TransitionBatches."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

import itertools

import numpy as np
import torch

from alight.algorithms.batch import META_KEYS, TransitionBatch
from alight.backends.verl import batch as vb

from .conftest import PAD, mixed_transitions

# Hand table for `mixed_transitions`: response lengths 5, 2, 6, 1, 4, 7; row 5's loss mask
# 1100110 ends on index 5; rewards 0.5 i - 1; groups g0 g0 g1 g1 - g0.
LAST_TOKEN = [4, 1, 5, 0, 3, 5]
REWARDS = [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]


def test_tensors_carry_verls_names_shapes_and_dtypes(batch: TransitionBatch) -> None:
    data = vb.to_data_proto(batch, temperature=0.7)
    b, p, r = len(batch), batch.prompt_length, batch.response_length
    shapes = {
        "prompts": ((b, p), torch.int64),
        "responses": ((b, r), torch.int64),
        "input_ids": ((b, p + r), torch.int64),
        "attention_mask": ((b, p + r), torch.int64),
        "position_ids": ((b, p + r), torch.int64),
        "response_mask": ((b, r), torch.int64),
        "old_log_probs": ((b, r), torch.float32),
        "advantages": ((b, r), torch.float32),
        "token_level_scores": ((b, r), torch.float32),
        "token_level_rewards": ((b, r), torch.float32),
        "rewards": ((b,), torch.float32),
        "has_old_log_probs": ((b,), torch.bool),
    }
    assert {key: (tuple(data.batch[key].shape), data.batch[key].dtype) for key in sorted(data.batch.keys())} == shapes
    assert len(data) == b and data.meta_info == {"temperature": 0.7}
    assert torch.equal(torch.cat([data.batch["prompts"], data.batch["responses"]], dim=1), data.batch["input_ids"])
    assert torch.equal(data.batch["old_log_probs"], batch.old_log_probs)
    assert torch.equal(data.batch["advantages"], batch.advantages)
    data.check_consistency()


def test_masks_and_position_ids_are_what_verl_computes(batch: TransitionBatch) -> None:
    from verl.utils.model import compute_position_id_with_mask

    data = vb.to_data_proto(batch)
    attention = data.batch["attention_mask"]
    assert torch.equal(attention, (data.batch["input_ids"] != PAD).long())  # no real token is PAD here
    assert torch.equal(data.batch["position_ids"], compute_position_id_with_mask(attention))
    response_real = attention[:, batch.prompt_length :]
    # verl's compute_response_mask is the response half of attention_mask; the trajectory row
    # (row 5) also zeroes the tokens that were inserted, not generated
    expected = response_real.clone()
    expected[5, :7] = torch.tensor([1, 1, 0, 0, 1, 1, 0])
    assert torch.equal(data.batch["response_mask"], expected)
    assert torch.equal(data.batch["advantages"] != 0, expected.bool())


def test_token_level_rewards_sit_on_each_rows_last_loss_token(batch: TransitionBatch) -> None:
    rewards = vb.to_data_proto(batch).batch["token_level_rewards"]
    expected = torch.zeros_like(rewards)
    for row, (column, reward) in enumerate(zip(LAST_TOKEN, REWARDS, strict=True)):
        expected[row, column] = reward
    assert torch.equal(rewards, expected)


def test_a_row_without_loss_tokens_gets_no_reward() -> None:
    rows = mixed_transitions()[:2]
    rows[1] = rows[1].model_copy(update={"response_mask": [0, 0]})
    rewards = vb.token_level_rewards(TransitionBatch.from_transitions(rows, PAD))
    assert rewards[1].abs().sum() == 0 and rewards[0, 4] == -1.0


def test_uids_group_rows_the_way_verls_grpo_reads_them(batch: TransitionBatch) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    data = vb.to_data_proto(batch)
    uid = data.non_tensor_batch["uid"]
    assert uid.dtype == object and len(set(uid.tolist())) == 3
    advantages, _ = compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], uid, norm_adv_by_std_in_grpo=False
    )
    # groups by hand: g0 = rows 0, 1, 5; g1 = rows 2, 3; row 4 alone (verl's mean of a lone row is 0)
    g0 = (REWARDS[0] + REWARDS[1] + REWARDS[5]) / 3
    g1 = (REWARDS[2] + REWARDS[3]) / 2
    expected = [REWARDS[0] - g0, REWARDS[1] - g0, REWARDS[2] - g1, REWARDS[3] - g1, REWARDS[4], REWARDS[5] - g0]
    per_row = (advantages * data.batch["response_mask"]).sum(1) / data.batch["response_mask"].sum(1)
    assert per_row.tolist() == pytest.approx(expected, abs=1e-6)


def test_metadata_travels_as_object_arrays(batch: TransitionBatch) -> None:
    data = vb.to_data_proto(batch)
    assert set(data.non_tensor_batch) == {"uid", *META_KEYS}
    for key in META_KEYS:
        column = data.non_tensor_batch[key]
        assert isinstance(column, np.ndarray) and column.dtype == object
        assert column.tolist() == batch.meta[key]
    assert data.non_tensor_batch["group_id"][4] is None
    with pytest.raises(ValueError, match="temperature must be positive"):
        vb.to_data_proto(batch, temperature=0.0)


def test_verls_unpadding_gives_back_exactly_the_real_tokens(batch: TransitionBatch) -> None:
    from verl.utils.attention_utils import unpad_input

    data = vb.to_data_proto(batch)
    tokens, indices, cu_seqlens, max_len, *_ = unpad_input(
        data.batch["input_ids"].unsqueeze(-1), data.batch["attention_mask"]
    )
    expected = [list(t.prompt_ids) + list(t.response_ids) for t in mixed_transitions()]
    flat = tokens.squeeze(-1).tolist()
    bounds = cu_seqlens.tolist()
    assert [flat[a:b] for a, b in itertools.pairwise(bounds)] == expected
    assert max_len == max(map(len, expected))
    positions = data.batch["position_ids"].flatten()[indices]
    assert [positions[a:b].tolist() for a, b in itertools.pairwise(bounds)] == [
        list(range(len(row))) for row in expected
    ]


def test_the_worker_format_round_trips_through_verls_padding(batch: TransitionBatch) -> None:
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    data = vb.to_data_proto(batch, temperature=0.7)
    td = vb.to_no_padding(data)
    expected = [list(t.prompt_ids) + list(t.response_ids) for t in mixed_transitions()]
    ids = td["input_ids"]
    assert ids.is_nested and [row.tolist() for row in ids.unbind()] == expected
    assert [row.tolist() for row in td["position_ids"].unbind()] == [list(range(len(row))) for row in expected]
    assert tu.get(td, "temperature") == 0.7 and torch.equal(td["loss_mask"], data.batch["response_mask"])
    # A model output at position t is about token t + 1: "predict the next token" must read back
    # as the responses themselves, where verl's trainer reads log-probs and values.
    next_token = torch.nested.nested_tensor_from_jagged(torch.roll(ids.values(), -1), offsets=ids.offsets())
    back = no_padding_2_padding(next_token, td)
    real = data.batch["attention_mask"][:, batch.prompt_length :].bool()
    assert torch.equal(back[real], data.batch["responses"][real])
    assert back[~real].abs().sum() == 0


def test_verls_dataproto_operations_work_on_it(batch: TransitionBatch) -> None:
    from verl import DataProto

    data = vb.to_data_proto(batch)
    chunks = data.chunk(3)
    assert [len(c) for c in chunks] == [2, 2, 2]
    joined = DataProto.concat(chunks)
    for key in sorted(data.batch.keys()):
        assert torch.equal(joined.batch[key], data.batch[key])
    assert joined.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()
    assert [len(part) for part in data.split(4)] == [4, 2]
    picked = data.select(batch_keys=["input_ids", "old_log_probs"], non_tensor_batch_keys=["uid"])
    assert set(picked.batch.keys()) == {"input_ids", "old_log_probs"} and set(picked.non_tensor_batch) == {"uid"}
    subset = data.select_idxs([4, 0])
    assert subset.non_tensor_batch["rollout_id"].tolist() == ["ro-4", "ro-0"]
    assert torch.equal(subset.batch["advantages"], data.batch["advantages"][[4, 0]])


@pytest.mark.parametrize(("k", "pad"), [(1, 0), (3, 0), (4, 2), (5, 4), (8, 2)])
def test_padding_to_a_multiple_and_back(batch: TransitionBatch, k: int, pad: int) -> None:
    data = vb.to_data_proto(batch)
    padded, pad_size = vb.pad_to_multiple(data, k)
    assert (pad_size, len(padded) % k) == (pad, 0)
    copies, _ = vb.pad_to_multiple(data, k, masked=False)
    for key in vb.MASKED_ON_PADDING:
        assert padded.batch[key][len(data) :].abs().sum() == 0
        if key != "response_mask":
            assert torch.equal(copies.batch[key][len(data) :], data.batch[key][:pad])
    assert torch.equal(padded.batch["input_ids"][len(data) :], data.batch["input_ids"][:pad])
    # an added row keeps 2 tokens (the prompt's last, the response's first): verl drops the rest
    width = data.batch["prompts"].shape[1]
    for added in (padded, copies) if pad else ():
        attention = added.batch["attention_mask"][len(data) :]
        assert torch.equal(attention.sum(1), torch.full((pad,), 2)) and attention[:, width - 1 : width + 1].all()
        assert torch.equal(
            added.batch["position_ids"][len(data) :, width - 1 : width + 1], torch.tensor([[0, 1]] * pad)
        )
    assert copies.batch["response_mask"][len(data) :].sum() == pad
    back = vb.unpad(padded, pad_size)
    for key in sorted(data.batch.keys()):
        assert torch.equal(back.batch[key], data.batch[key])
    assert torch.equal(vb.response_values(padded, "old_log_probs", pad_size=pad_size), data.batch["old_log_probs"])
    with pytest.raises(ValueError, match="not a \\[B, R\\] tensor"):
        vb.response_values(padded, "rewards")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_masked_padding_changes_token_mean_not_at_all_and_seq_means_by_rows(batch: TransitionBatch, mode: str) -> None:
    from verl.trainer.ppo.core_algos import agg_loss

    data = vb.to_data_proto(batch)
    padded, pad_size = vb.pad_to_multiple(data, 4)
    loss = torch.randn(data.batch["response_mask"].shape, generator=torch.Generator().manual_seed(0))
    padded_loss = torch.cat([loss, loss[:pad_size]])
    rows = len(data)
    # verl's workers pass the step's row count as global_batch_size, padding included
    plain = agg_loss(loss, data.batch["response_mask"], mode, global_batch_size=rows if mode != "token-mean" else None)
    with_padding = agg_loss(
        padded_loss,
        padded.batch["response_mask"],
        mode,
        global_batch_size=rows + pad_size if mode != "token-mean" else None,
    )
    scale = 1.0 if mode == "token-mean" else rows / (rows + pad_size)
    assert float(with_padding) == pytest.approx(float(plain) * scale, rel=1e-6)


@pytest.mark.parametrize(
    ("rows", "mini", "world", "micro", "expected"),
    [
        (6, None, 1, 1, (6, 6)),
        (6, None, 4, 1, (8, 8)),
        (10, 4, 2, 1, (4, 12)),
        (10, 3, 2, 1, (4, 12)),
        (5, 16, 1, 1, (5, 5)),
        (5, None, 1, 2, (6, 6)),  # one rank: 5 rows are not whole micro-batches of 2
        (5, None, 2, 2, (8, 8)),  # two ranks of 4 rows, 2 micro-batches each
        (12, 4, 2, 3, (6, 12)),  # a step of 4 rows is 2 per rank, not a micro-batch of 3: 6
        (3, None, 2, 8, (16, 16)),
    ],
)
def test_update_layout(rows: int, mini: int | None, world: int, micro: int, expected: tuple[int, int]) -> None:
    step, padded = vb.update_layout(rows, mini, world, micro)
    assert (step, padded) == expected
    assert (step // world) % micro == 0 and step % world == 0 and padded % step == 0 and padded >= rows
