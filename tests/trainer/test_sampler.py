"""TaskSampler: seeded epochs over the train rows, resumable from a position."""

from __future__ import annotations

import pytest

from alight.trainer.sampler import TaskSampler


def draw(sampler: TaskSampler, steps: int) -> list[list[int]]:
    return [sampler.next_batch() for _ in range(steps)]


@pytest.mark.parametrize(("n_rows", "batch_size"), [(6, 2), (6, 3), (5, 5), (7, 1)])
def test_every_row_once_per_epoch(n_rows: int, batch_size: int) -> None:
    sampler = TaskSampler(n_rows, batch_size, seed=3)
    for epoch in range(3):
        rows = [i for batch in draw(sampler, n_rows // batch_size) for i in batch]
        assert sorted(rows) == list(range(n_rows)), epoch
        assert sampler.epoch == epoch + 1


def test_epochs_come_in_fresh_orders() -> None:
    sampler = TaskSampler(20, 20, seed=0)
    first, second = sampler.next_batch(), sampler.next_batch()
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second


def test_a_batch_spans_the_end_of_one_epoch_and_the_next() -> None:
    sampler = TaskSampler(5, 3, seed=1)
    whole = TaskSampler(5, 5, seed=1)
    epoch0, epoch1 = whole.next_batch(), whole.next_batch()
    first, second = sampler.next_batch(), sampler.next_batch()
    assert first == epoch0[:3]
    assert second == epoch0[3:] + epoch1[:1]
    assert sampler.position == 6 and sampler.epoch == pytest.approx(1.2)


def test_a_batch_larger_than_the_data_spans_several_epochs() -> None:
    whole = TaskSampler(3, 3, seed=2)
    epochs = [whole.next_batch() for _ in range(3)]
    assert TaskSampler(3, 7, seed=2).next_batch() == epochs[0] + epochs[1] + epochs[2][:1]


def test_the_order_is_a_function_of_the_seed() -> None:
    assert draw(TaskSampler(10, 4, seed=7), 6) == draw(TaskSampler(10, 4, seed=7), 6)
    assert draw(TaskSampler(10, 4, seed=7), 6) != draw(TaskSampler(10, 4, seed=8), 6)


@pytest.mark.parametrize("stop_after", [1, 2, 3, 5])
def test_resuming_from_position_continues_the_same_sequence(stop_after: int) -> None:
    uninterrupted = draw(TaskSampler(7, 3, seed=11), 8)
    first = TaskSampler(7, 3, seed=11)
    draw(first, stop_after)
    resumed = TaskSampler(7, 3, seed=11, position=first.position)  # what a checkpoint records
    assert draw(resumed, 8 - stop_after) == uninterrupted[stop_after:]


@pytest.mark.parametrize(("n_rows", "batch_size"), [(0, 2), (4, 0)])
def test_rows_and_a_positive_batch_size_are_needed(n_rows: int, batch_size: int) -> None:
    with pytest.raises(ValueError, match="sampler"):
        TaskSampler(n_rows, batch_size, seed=0)
