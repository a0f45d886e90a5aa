import torch

from trainer.data import balance, collate, loss_token_count


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
