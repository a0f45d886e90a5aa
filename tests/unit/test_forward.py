"""Packed and padded micro-batches give the same logprobs, entropies, loss and gradients."""

from __future__ import annotations

import random

import pytest
import torch

import trainer.forward as forward_module
from shared.config import LossConfig
from tests.reference import entropy, token_logprobs
from trainer.data import collate, micro_batches
from trainer.forward import chunk_logprobs, chunked_logprobs, packed_forward, packing_layout, padded_forward
from trainer.loss import BatchTotals, policy_loss


def tiny_of_type(model_type: str, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        num_experts=4,  # the mixtures of experts' (the others ignore these)
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        **extra,
    )
    return AutoModelForCausalLM.from_config(config).float()


def tiny_model():
    return tiny_of_type("qwen2")


def rows(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(5):
        n_prompt, n_completion = rng.randint(2, 6), rng.randint(1, 9)
        mask = [False] * n_prompt + [True] * n_completion
        out.append(
            dict(
                input_ids=[rng.randrange(64) for _ in mask],
                loss_mask=mask,
                logprobs=[rng.uniform(-5, -0.1) if m else 0.0 for m in mask],
                advantage=rng.uniform(-1, 1),
                sample_id=str(i),
            )
        )
    return out


def test_packing_layout_restarts_positions_at_each_row():
    positions, starts = packing_layout(torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert positions.tolist() == [[0, 1, 2, 0, 1]]
    assert starts.tolist() == [True, False, False, True, False]


def test_packed_rows_do_not_attend_across_rows():
    """Changing the first row's tokens leaves the second row's logprobs as they were: the mask
    transformers builds from the position ids is block-diagonal."""
    model = tiny_model()
    batch = collate(rows()[:2], pad_id=0)
    changed = rows()[:2]
    changed[0]["input_ids"] = [(t + 1) % 64 for t in changed[0]["input_ids"]]
    with torch.no_grad():
        before = packed_forward(model, batch, 1.0)[0]
        after = packed_forward(model, collate(changed, pad_id=0), 1.0)[0]
    assert not torch.equal(before[0], after[0])
    torch.testing.assert_close(before[1], after[1])


def test_chunked_logprobs_equal_the_whole_in_values_and_gradients(monkeypatch):
    torch.manual_seed(0)
    logits = torch.randn(1, 37, 64, requires_grad=True)
    targets = torch.randint(0, 64, (1, 37))
    whole = chunk_logprobs(logits, targets, 0.7, with_entropy=True)
    (whole[0].sum() + whole[1].sum()).backward()
    expected_grad, logits.grad = logits.grad.clone(), None
    monkeypatch.setattr(forward_module, "LOGIT_CHUNK_ELEMENTS", 5 * 64)  # 8 chunks, the last of 2
    parts = chunked_logprobs(logits, targets, 0.7, with_entropy=True)
    (parts[0].sum() + parts[1].sum()).backward()
    torch.testing.assert_close(parts[0], whole[0])
    torch.testing.assert_close(parts[1], whole[1])
    torch.testing.assert_close(logits.grad, expected_grad)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_equals_padded_in_values_and_gradients(temperature):
    batch = collate(rows(), pad_id=0)
    totals = BatchTotals(sequences=5, tokens=int(batch.loss_mask.sum()))
    results = []
    for forward in (padded_forward, packed_forward):
        model = tiny_model()
        logprobs, entropy = forward(model, batch, temperature)
        spec = LossConfig(kind="ppo_clip", aggregation="seq_mean_token_mean")
        parts = policy_loss(logprobs, batch.sampler_logprobs, batch.advantages, batch.loss_mask, spec, totals)
        parts.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((logprobs * batch.loss_mask, entropy * batch.loss_mask, parts.loss, grads))
    (lp_a, ent_a, loss_a, grads_a), (lp_b, ent_b, loss_b, grads_b) = results
    assert torch.allclose(lp_a, lp_b, atol=1e-5) and torch.allclose(ent_a, ent_b, atol=1e-5)
    assert loss_a.item() == pytest.approx(loss_b.item(), abs=1e-6)
    assert all(torch.allclose(grads_a[n], grads_b[n], atol=1e-6) for n in grads_a)
    assert any(g.abs().max() > 1e-4 for g in grads_a.values())  # the gradients are not all zero


def whole_vocabulary_forward(model, batch, temperature: float, with_entropy: bool = True):
    """The reference: logits at every position, as a model returns them by default."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return token_logprobs(logits, batch.input_ids, temperature), entropy(logits, temperature)


@pytest.mark.parametrize("forward", [padded_forward, packed_forward])
def test_logits_only_where_they_predict_a_loss_token_give_the_whole_forward_s_loss_and_gradients(forward):
    batch = collate(rows(3), pad_id=0)
    totals = BatchTotals(sequences=5, tokens=int(batch.loss_mask.sum()))
    results = []
    for f in (whole_vocabulary_forward, forward):
        model = tiny_model()
        logprobs, ent = f(model, batch, 0.8)
        spec = LossConfig(kind="ppo_clip", aggregation="seq_mean_token_mean")
        parts = policy_loss(logprobs, batch.sampler_logprobs, batch.advantages, batch.loss_mask, spec, totals)
        parts.loss.backward()
        results.append((logprobs, ent, parts.loss, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp_ref, ent_ref, loss_ref, grads_ref), (lp, ent, loss, grads) = results
    mask = batch.loss_mask
    assert torch.allclose(lp_ref * mask, lp, atol=1e-5) and torch.allclose(
        ent_ref * mask, ent * mask, atol=1e-5
    )
    assert lp[~mask].abs().max() == 0  # nothing where no loss token is predicted
    assert loss.item() == pytest.approx(loss_ref.item(), abs=1e-6)
    assert all(torch.allclose(grads_ref[n], grads[n], atol=1e-6) for n in grads_ref)


@pytest.mark.parametrize("forward", [padded_forward, packed_forward])
def test_a_micro_batch_without_loss_tokens_still_reaches_every_parameter(forward):
    """A rank with no rows gets one masked token: its backward must still give each parameter a
    (zero) gradient, as FSDP reduces every parameter's gradient on every rank."""
    batch = collate([], pad_id=0)
    model = tiny_model()
    logprobs, ent = forward(model, batch, 1.0)
    (logprobs.sum() + ent.sum() * 0).backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_packed_micro_batches_count_real_tokens():
    lengths = [10, 9, 3, 2]
    assert micro_batches(lengths, [[0, 1, 2, 3]], token_budget=19) == [[[0], [1, 2], [3]]]
    assert micro_batches(lengths, [[0, 1, 2, 3]], token_budget=19, packed=True) == [[[0, 1], [2, 3]]]


def own_forward_logprobs(model, batch, temperature: float):
    """The logprobs from the model's own forward (its output layer and whatever follows it)."""
    keep = forward_module.predicting(batch.loss_mask)
    targets = batch.input_ids[:, (keep + 1).clamp(max=batch.input_ids.shape[1] - 1)]
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    logits = model(**inputs, logits_to_keep=keep, use_cache=False).logits
    return chunk_logprobs(logits, targets, temperature, with_entropy=True)


def step_of(model, forward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    picked, entropies = forward(model)
    (picked.sum() + entropies.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return torch.cat([picked, entropies]), grads


@pytest.mark.parametrize("model_type", sorted(forward_module.PLAIN_HEAD_TYPES))
def test_each_plain_head_type_s_logits_are_its_head_on_the_final_hidden_states(model_type, monkeypatch):
    """The list is right for the pinned transformers: the head run in chunks outside the model's
    forward gives the model's own forward's logprobs and gradients."""
    batch = collate(rows(1), pad_id=0)
    model = tiny_of_type(model_type)
    keep = forward_module.predicting(batch.loss_mask)
    targets = batch.input_ids[:, (keep + 1).clamp(max=batch.input_ids.shape[1] - 1)]
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    own, own_grads = step_of(model, lambda m: own_forward_logprobs(m, batch, 0.7))
    monkeypatch.setattr(forward_module, "LOGIT_CHUNK_ELEMENTS", 3 * 64)  # chunks of 3 positions
    mine, grads = step_of(
        model,
        lambda m: forward_module.target_logprobs(m, inputs, forward_module.Scoring(keep, targets, 0.7, True)),
    )
    torch.testing.assert_close(mine, own)
    assert grads.keys() == own_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], own_grads[name])


def test_a_model_that_soft_caps_its_logits_runs_its_own_forward():
    """Gemma 2 soft-caps the output layer's logits in its forward: its logprobs are the capped
    logits', not the bare layer's."""
    model = tiny_of_type("gemma2", final_logit_softcapping=2.0)
    assert not forward_module.has_plain_head(model)
    batch = collate(rows(2), pad_id=0)
    logprobs, _ = padded_forward(model, batch, 1.0)
    reference, _ = whole_vocabulary_forward(model, batch, 1.0)
    mask = batch.loss_mask
    torch.testing.assert_close(logprobs, reference * mask)
    keep = forward_module.predicting(mask)
    targets = batch.input_ids[:, keep + 1]
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    bare, _ = forward_module.hidden_logprobs(model, inputs, forward_module.Scoring(keep, targets, 1.0, False))
    assert not torch.allclose(bare, logprobs[:, keep + 1])  # the bare layer would be wrong here


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    from shared.net import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_under_fsdp_the_head_outside_the_forward_gets_the_forward_s_values_and_gradients(one_rank_group):
    """FSDP2 gathers the root's parameters (the output layer's among them) for the registered
    method as for `forward`, and reduces the gradients it gives them."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.parallel import apply_fsdp

    batch = collate(rows(4), pad_id=0)
    keep = forward_module.predicting(batch.loss_mask)
    targets = batch.input_ids[:, (keep + 1).clamp(max=batch.input_ids.shape[1] - 1)]
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    mesh = init_device_mesh("cpu", (1,))
    results = []
    for forward in (
        lambda m: own_forward_logprobs(m, batch, 1.0),  # every kept position's logits held
        lambda m: forward_module.target_logprobs(m, inputs, forward_module.Scoring(keep, targets, 1.0, True)),
    ):
        model = tiny_model()
        apply_fsdp(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        assert hasattr(model, forward_module.KEPT_LOGPROBS)
        picked, entropies = forward(model)
        (picked.sum() + entropies.sum()).backward()
        grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
        results.append((torch.cat([picked, entropies]), grads))
    (own, own_grads), (mine, grads) = results
    torch.testing.assert_close(mine, own)
    assert grads.keys() == own_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], own_grads[name])
    assert own_grads["lm_head.weight"].abs().max() > 0


def test_a_sharded_model_without_the_registered_method_is_refused(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = tiny_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    with pytest.raises(RuntimeError, match="attach_kept_logprobs"):
        padded_forward(model, collate(rows(), pad_id=0), 1.0)
