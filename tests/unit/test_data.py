import torch

from trainer.data import balance, collate, even_slices, loss_token_count, micro_batches


def test_balance_is_token_even_and_complete():
    lengths = [10, 9, 8, 3, 2, 1]
    shares = balance(lengths, 2)
    assert sorted(i for s in shares for i in s) == list(range(6))
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert loads == [16, 17] or loads == [17, 16]
    assert balance(lengths, 2) == shares  # deterministic on every rank


def test_balance_more_ranks_than_samples():
    assert balance([5], 3) == [[0], [], []]


def row(ids, mask, lps, adv):
    return dict(input_ids=ids, loss_mask=mask, logprobs=lps, advantage=adv)


def test_collate_pads_right_and_masks_padding():
    rows = [
        row([1, 2, 3], [False, True, True], [0.0, -1.0, -2.0], 0.5),
        row([4, 5], [False, True], [0.0, -3.0], -1.0),
    ]
    mb = collate(rows, pad_id=0)
    assert mb.input_ids.tolist() == [[1, 2, 3], [4, 5, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert mb.loss_mask.tolist() == [[False, True, True], [False, True, False]]
    assert mb.sampler_logprobs.tolist() == [[0.0, -1.0, -2.0], [0.0, -3.0, 0.0]]
    assert mb.advantages.tolist() == [0.5, -1.0]
    assert loss_token_count(rows) == 3


def test_collate_empty_share_is_one_masked_token():
    mb = collate([], pad_id=7)
    assert mb.input_ids.tolist() == [[7]] and not mb.loss_mask.any()
    assert mb.advantages.dtype == torch.float32


def test_micro_batches_respect_the_token_budget_and_align_ranks():
    lengths = [10, 9, 8, 3, 2, 1, 7]
    shares = [[0, 2, 4, 6], [1, 3, 5]]
    plan = micro_batches(lengths, shares, token_budget=16)
    assert len(plan[0]) == len(plan[1])  # same number of forward/backward passes on every rank
    for rank, share in enumerate(shares):
        assert sorted(i for mb in plan[rank] for i in mb) == sorted(share)
        for mb in plan[rank]:
            if mb:
                assert max(lengths[i] for i in mb) * len(mb) <= 16 or len(mb) == 1
    assert plan[0] == [[0], [2, 6], [4]] and plan[1] == [[1], [3, 5], []]


def test_one_micro_batch_when_the_budget_allows():
    assert micro_batches([3, 4], [[0, 1]], token_budget=100) == [[[1, 0]]]
    assert micro_batches([], [[], []], token_budget=10) == [[[]], [[]]]


def test_even_slices_cover_the_batch_in_order():
    assert even_slices(10, 3) == [range(0, 4), range(4, 7), range(7, 10)]
    assert even_slices(4, 1) == [range(0, 4)]
    assert even_slices(2, 5) == [range(0, 1), range(1, 2)]  # never an empty optimizer step
    for count, parts in [(7, 2), (64, 4), (5, 5)]:
        slices = even_slices(count, parts)
        assert [i for s in slices for i in s] == list(range(count))
        assert max(map(len, slices)) - min(map(len, slices)) <= 1
