"""The train sampler's global data order (world-size invariance, resume anywhere) and eval sharding."""

from __future__ import annotations

from collections import Counter

import pytest

from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler, ShardedEvalSampler, epoch_order

GLOBAL_BATCH = 12  # divisible by world sizes 1, 2, 3 and 4


def global_batches(n: int, world: int, epoch: int = 0, consumed: int = 0, seed: int = 3) -> list[list[int]]:
    """Run every rank of a world and reassemble global batch i from the ranks' i-th per-rank batches."""
    per_rank = GLOBAL_BATCH // world
    shards = []
    for rank in range(world):
        sampler = ElasticDistributedSampler(range(n), GLOBAL_BATCH, num_replicas=world, rank=rank, seed=seed)
        sampler.set_epoch(epoch)
        sampler.set_consumed_samples(consumed)
        items = list(sampler)
        assert all(e == epoch for e, _ in items)
        shards.append([i for _, i in items])
    lengths = {len(s) for s in shards}
    assert len(lengths) == 1, f"ranks yield different numbers of samples {lengths}: DDP would hang"
    num_batches = lengths.pop() // per_rank
    return [
        sorted(i for s in shards for i in s[b * per_rank : (b + 1) * per_rank]) for b in range(num_batches)
    ]


@pytest.mark.parametrize("n", [48, 37, 5])  # whole batches, a padded last batch, smaller than one batch
def test_global_batches_identical_for_world_sizes_1_to_4(n):
    reference = global_batches(n, 1)
    assert Counter(i for b in reference for i in b) >= Counter(range(n)), "every sample is seen each epoch"
    assert all(len(b) == GLOBAL_BATCH for b in reference)
    for world in (2, 3, 4):
        assert global_batches(n, world) == reference, f"world size {world} changes the global batches"


@pytest.mark.parametrize(("first_world", "second_world"), [(2, 3), (4, 1), (1, 4), (3, 2)])
def test_resume_on_another_world_size_yields_exactly_the_rest(first_world, second_world):
    n, stop_after = 60, 2  # 5 global batches; stop after 2
    seen_before = global_batches(n, first_world, epoch=4)[:stop_after]
    # Save on the first world size, restore on the second one.
    saver = ElasticDistributedSampler(range(n), GLOBAL_BATCH, num_replicas=first_world, rank=0, seed=3)
    saver.set_epoch(4)
    saver.set_consumed_samples(stop_after * GLOBAL_BATCH)
    state = saver.state_dict()
    assert state == {"epoch": 4, "consumed_samples": 24, "seed": 3, "num_samples": n}

    rest = []
    for rank in range(second_world):
        sampler = ElasticDistributedSampler(
            range(n), GLOBAL_BATCH, num_replicas=second_world, rank=rank, seed=3
        )
        sampler.load_state_dict(state)
        assert sampler.remaining() == (n - 24) // second_world
        items = list(sampler)
        assert {e for e, _ in items} == {4}
        rest += [i for _, i in items]
    before = [i for b in seen_before for i in b]
    assert sorted(before + rest) == list(range(n)), "a sample was skipped or repeated across the resume"
    # The iteration after the resumed one starts the next epoch from its beginning.
    sampler.set_epoch(5)
    assert len(list(sampler)) == n // second_world


def test_epochs_give_different_permutations_and_are_reproducible():
    orders = [epoch_order(100, seed=0, epoch=e, global_batch_size=10) for e in range(3)]
    assert all(sorted(o.tolist()) == list(range(100)) for o in orders)
    assert not (orders[0] == orders[1]).all() and not (orders[1] == orders[2]).all()
    again = ElasticDistributedSampler(range(100), 10, seed=0)
    again.set_epoch(1)
    assert [i for _, i in again] == orders[1].tolist()
    other_seed = epoch_order(100, seed=1, epoch=1, global_batch_size=10)
    assert not (other_seed == orders[1]).all()


def test_len_is_the_full_epoch_while_a_resume_yields_the_rest():
    sampler = ElasticDistributedSampler(range(50), GLOBAL_BATCH, num_replicas=2, rank=1)
    assert len(sampler) == 60 // 2  # 50 padded to 5 global batches of 12
    sampler.set_consumed_samples(36)
    assert len(sampler) == 30 and sampler.remaining() == 12
    assert len(list(sampler)) == 12
    assert sampler.state_dict()["consumed_samples"] == 0  # consumed by that iteration
    assert len(list(sampler)) == 30


def test_end_of_epoch_state_resumes_at_the_next_epoch():
    sampler = ElasticDistributedSampler(range(24), GLOBAL_BATCH, seed=0)
    sampler.load_state_dict({"epoch": 2, "consumed_samples": 24, "seed": 0})
    assert sampler.state_dict() == {"epoch": 3, "consumed_samples": 0, "seed": 0, "num_samples": 24}
    assert [i for _, i in sampler] == epoch_order(24, 0, 3, GLOBAL_BATCH).tolist()


def test_a_training_set_that_changed_size_restarts_the_epoch_with_a_warning():
    """Files deleted between the save and the resume: the mid-epoch position belongs to another permutation."""
    sampler = ElasticDistributedSampler(range(40), GLOBAL_BATCH, seed=0)
    with pytest.warns(UserWarning, match="has 40 images but the checkpoint was saved with 48"):
        sampler.load_state_dict({"epoch": 1, "consumed_samples": 24, "seed": 0, "num_samples": 48})
    assert (sampler.epoch, sampler.remaining()) == (1, 48)  # 40 padded to 4 global batches of 12
    assert [i for _, i in sampler] == epoch_order(40, 0, 1, GLOBAL_BATCH).tolist()
    # Saved at an epoch end: nothing of the old order is pending, the next epoch uses the new size.
    sampler.load_state_dict({"epoch": 1, "consumed_samples": 48, "seed": 0, "num_samples": 48})
    assert (sampler.epoch, sampler.consumed_samples) == (2, 0)
    # Checkpoints from before the size was recorded keep their position.
    sampler.load_state_dict({"epoch": 1, "consumed_samples": 24, "seed": 0})
    assert sampler.consumed_samples == 24


def test_set_epoch_keeps_a_restored_position_only_for_its_own_epoch():
    sampler = ElasticDistributedSampler(range(48), GLOBAL_BATCH, seed=0)
    sampler.load_state_dict({"epoch": 1, "consumed_samples": 12, "seed": 0})
    sampler.set_epoch(1)
    assert sampler.remaining() == 36
    sampler.set_epoch(2)
    assert sampler.remaining() == 48


def test_bad_settings_give_clear_errors():
    with pytest.raises(ValueError, match="multiple of the world size"):
        ElasticDistributedSampler(range(10), 8, num_replicas=3, rank=0)
    sampler = ElasticDistributedSampler(range(48), GLOBAL_BATCH)
    with pytest.raises(ValueError, match="multiple of the global batch size"):
        sampler.set_consumed_samples(5)
    with pytest.raises(ValueError, match="seed"):
        sampler.load_state_dict({"epoch": 0, "consumed_samples": 0, "seed": 7})


@pytest.mark.parametrize("n", [1, 10, 13])
def test_eval_sharding_covers_each_index_once(n):
    for world in (1, 2, 3, 4):
        shards = [list(ShardedEvalSampler(range(n), num_replicas=world, rank=r)) for r in range(world)]
        flat = [i for s in shards for i in s]
        assert sorted(flat) == list(range(n)), f"world {world}: duplicates or gaps"
        assert [len(s) for s in shards] == [len(ShardedEvalSampler(range(n), world, r)) for r in range(world)]
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_rect_eval_batches_lie_in_one_group_on_any_world_size():
    """Groups of the global batch in aspect-ratio order: every per-device batch is inside one group."""
    import numpy as np

    from yolo11_lightning.data.rect_batches import rect_batches

    rng = np.random.default_rng(0)
    heights, widths = rng.integers(20, 400, 29), rng.integers(20, 400, 29)
    global_batch = 8
    order, shapes = rect_batches(heights, widths, global_batch, 160)
    group = {int(i): p // global_batch for p, i in enumerate(order)}
    assert len({tuple(s) for s in shapes}) > 1
    for world in (1, 2, 4, 8):
        seen = []
        for rank in range(world):
            indices = list(ShardedEvalSampler(range(29), world, rank, order=order))
            per_device = global_batch // world
            for start in range(0, len(indices), per_device):
                batch = indices[start : start + per_device]
                assert len({group[i] for i in batch}) == 1, (
                    f"world {world} rank {rank}: batch {batch} spans groups"
                )
            seen += indices
        assert sorted(seen) == list(range(29))
    with pytest.raises(ValueError, match="permutation"):
        ShardedEvalSampler(range(29), order=np.zeros(29, np.int64))
