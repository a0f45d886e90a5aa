"""The simulator on cases with closed-form answers, its staleness rule against the orchestrator's,
and its calibration pieces."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from statistics import mean

import pytest

from orchestrator.batches import staleness
from shared.errors import TriadError
from simulate import pipeline
from simulate.calibrate import capped_mean, fit_lengths, line_fit
from simulate.pipeline import simulate
from simulate.server import Group, Server
from simulate.setup import Inference, Lengths, Setup, Trainer, parse_count
from tests.helpers import run_triad

ITER_S, LENGTH = 0.01, 100  # a request of 100 tokens takes 1 s on a server


def setup(**changes) -> Setup:
    """One server, 100-token completions, a trainer and hand-off that take no time."""
    base = dict(
        servers=1,
        train_gpus=1,
        inference=Inference(
            iter_base_s=ITER_S,
            iter_per_seq_s=0.0,
            iter_per_kv_token_s=0.0,
            max_seqs=10**6,
            prefill_tokens_per_s=1e15,
            load_s=0.0,
        ),
        trainer=Trainer(
            params=1.0,
            peak_flops=1e30,
            mfu=1.0,
            overhead_s=0.0,
            handoff_bytes_per_s=1e30,
            publish_overhead_s=0.0,
        ),
        lengths=Lengths(LENGTH, 1.0, LENGTH, empirical=(LENGTH,)),
        prompt_tokens=10,
        batch_size=4,
        group_size=2,
        max_inflight=4,
        max_async_level=1,
        max_steps=30,
    )
    base.update(changes)
    return Setup(**base)


def test_one_server_with_fixed_lengths():
    # a batch is 4 groups of 2 running together: 8 samples a second, each 10 prompt + 100 tokens
    r = simulate(setup())
    assert r.samples_per_s() == pytest.approx(8.0, rel=1e-6)
    assert r.tokens_per_s() == pytest.approx(880.0, rel=1e-6)
    assert r.step_s() == pytest.approx(1.0, rel=1e-6)


def test_the_trainer_trains_the_prompt_tokens_as_well_as_the_completion():
    # η = 0: generate 1 s, then train 8 samples x (10 prompt + 100 completion) = 880 tokens at 6 FLOPs a
    # token on a GPU of 6 x 880 FLOP/s: 1 s (completion tokens alone would take 800 / 880 s)
    trainer = Trainer(
        params=1.0,
        peak_flops=6.0 * 880,
        mfu=1.0,
        overhead_s=0.0,
        handoff_bytes_per_s=1e30,
        publish_overhead_s=0.0,
    )
    r = simulate(setup(max_async_level=0, trainer=trainer))
    assert r.step_s() == pytest.approx(2.0, rel=1e-6)
    assert r.tokens[5] == 880
    longer = simulate(setup(max_async_level=0, trainer=trainer, prompt_tokens=110))
    assert longer.step_s() == pytest.approx(1.0 + 1680 / 880, rel=1e-6)


def test_the_iteration_grows_with_the_batch_and_kv():
    # 8 sequences: each iteration 0.01 + 8 * 0.001 s; KV grows 8 tokens per iteration from 8 * 10
    inf = Inference(ITER_S, 0.001, 0.0, 10**6, 1e15, 0.0)
    assert simulate(setup(inference=inf)).step_s() == pytest.approx(LENGTH * 0.018, rel=1e-6)
    inf_kv = Inference(ITER_S, 0.0, 1e-6, 10**6, 1e15, 0.0)
    mean_kv = 8 * 10 + 8 * LENGTH / 2  # linear growth; the model holds the rate per interval
    assert simulate(setup(inference=inf_kv)).step_s() == pytest.approx(
        LENGTH * (ITER_S + 1e-6 * mean_kv), rel=0.05
    )


def test_max_seqs_queues_the_rest():
    # 8 sequences, 4 at a time: two rounds of 1 s per batch
    inf = Inference(ITER_S, 0.0, 0.0, 4, 1e15, 0.0)
    assert simulate(setup(inference=inf)).samples_per_s() == pytest.approx(4.0, rel=1e-6)


def test_eta_zero_has_no_overlap():
    # generate 1 s, write 0.05 s, train 0.5 s, publish 0.2 s, load 0.1 s: one after the other
    trainer = Trainer(
        params=1.0, peak_flops=1e30, mfu=1.0, overhead_s=0.5, handoff_bytes_per_s=1e30, publish_overhead_s=0.2
    )
    inf = Inference(ITER_S, 0.0, 0.0, 10**6, 1e15, 0.1)
    r = simulate(setup(max_async_level=0, trainer=trainer, inference=inf, batch_overhead_s=0.05))
    assert r.step_s() == pytest.approx(1.85, rel=1e-6)
    assert r.samples_per_s() == pytest.approx(8 / 1.85, rel=1e-6)
    path = r.critical_path()
    assert path["train"] == pytest.approx(0.5 / 1.85, rel=1e-3)
    assert path["publish"] == pytest.approx(0.2 / 1.85, rel=1e-3)
    # one step ahead, training and loading hide behind the next batch's generation
    r1 = simulate(
        setup(max_async_level=1, max_inflight=8, trainer=trainer, inference=inf, batch_overhead_s=0.05)
    )
    assert r1.samples_per_s() > 1.5 * r.samples_per_s()


@pytest.mark.parametrize(("eta", "expected"), [(0, 8.0), (3, 16.0), (5, 16.0)])
def test_an_infinitely_fast_trainer_leaves_the_servers_the_bound(eta, expected):
    # 2 servers, 8 groups in flight allowed: 16 sequences at once, 1 s each, so 16 samples/s; with
    # eta = 0 the guard lets only one batch (4 groups) run at a time: 8 samples/s. (At eta = 1 two
    # batches' groups finish at once in any order and some land one batch too late: dropped.)
    r = simulate(setup(servers=2, max_inflight=8, max_async_level=eta))
    assert r.samples_per_s() == pytest.approx(expected, rel=1e-6)
    assert r.dropped == 0


def test_groups_that_finish_out_of_order_are_dropped_as_stale():
    r = simulate(setup(servers=2, max_inflight=8, max_async_level=1))
    assert r.dropped > 0
    assert r.samples_per_s() < 16.0


def test_a_slow_trainer_is_the_bound_at_any_eta():
    trainer = Trainer(
        params=1.0, peak_flops=1e30, mfu=1.0, overhead_s=2.0, handoff_bytes_per_s=1e30, publish_overhead_s=0.0
    )
    for eta in (1, 2, 4):
        r = simulate(setup(max_async_level=eta, max_inflight=16, trainer=trainer))
        assert r.step_s() == pytest.approx(2.0, rel=1e-6)
        assert r.critical_path()["train"] == pytest.approx(1.0, rel=1e-6)


def test_the_trainers_spread_and_the_requests_spread_lengthen_each_step_as_drawn():
    # η = 0: generate 1 s, train 0.5 s, publish 0.2 s, one after the other; a trainer factor of 2
    # doubles train and publish, a request factor of 1.5 makes each request (and so the batch) 1.5 s
    trainer = Trainer(
        params=1.0, peak_flops=1e30, mfu=1.0, overhead_s=0.5, handoff_bytes_per_s=1e30, publish_overhead_s=0.2
    )
    base = setup(max_async_level=0, trainer=trainer)
    assert simulate(base).step_s() == pytest.approx(1.7, rel=1e-6)
    assert simulate(base.with_(trainer_factors=(2.0,))).step_s() == pytest.approx(2.4, rel=1e-6)
    slow = simulate(base.with_(request_factors=(1.5,)))
    assert slow.step_s() == pytest.approx(2.2, rel=1e-6)
    assert mean(slow.latencies) == pytest.approx(1.5, rel=1e-6)
    # spread with the same mean costs throughput where the guard waits on the slower of two chains
    spread = simulate(base.with_(max_async_level=1, max_inflight=8, trainer_factors=(0.2, 1.8)))
    assert spread.samples_per_s() < simulate(base.with_(max_async_level=1, max_inflight=8)).samples_per_s()
    with pytest.raises(TriadError, match="at least 1"):
        base.with_(request_factors=(0.9, 1.2))


def test_the_spreads_read_from_a_run():
    from simulate.calibrate import request_spread, trainer_spread

    rows = [{"request_spans": [[0, 1.0], [0, 2.0], [0, 4.0]]}, {"request_spans": [[0, 0.5], [0, 0.5]]}]
    assert request_spread(rows) == (1.0, 1.0, 2.0, 1.0, 1.0)
    steps = [
        {"read_s": 0.1, "train_s": 0.5, "publish_s": 0.2, "tokens": 100},
        {"train_s": 1.5, "publish_s": 0.1, "tokens": 200},
    ]
    assert trainer_spread(steps, 0.2, 0.004, 0.2) == pytest.approx((0.8 / 0.8, 1.6 / 1.2))


def test_recomputing_log_probs_adds_a_forward_pass_to_the_step():
    # a batch is 8 samples of 10 + 100 tokens (880 tokens); 6 FLOPs per token train, 2 more per pass
    slow = dict(
        params=1.0,
        peak_flops=880.0,
        mfu=1.0,
        overhead_s=0.0,
        handoff_bytes_per_s=1e30,
        publish_overhead_s=0.0,
    )
    assert Trainer(**slow).train_s(880, 1) == pytest.approx(6.0)
    assert Trainer(**slow, logprob_passes=1).train_s(880, 2) == pytest.approx(4.0)
    # the trainer is the bound (6 s, then 8 s a step against 1 s of generation), at η = 2
    for passes, step in ((0, 6.0), (1, 8.0)):
        trainer = Trainer(**slow, logprob_passes=passes)
        r = simulate(setup(max_async_level=2, max_inflight=12, trainer=trainer))
        assert r.step_s() == pytest.approx(step, rel=1e-6)


def test_abort_and_resubmit_keeps_the_tokens_and_pays_the_prefill():
    inf = Inference(ITER_S, 0.0, 0.0, 10**6, 1000.0, 0.0)
    keep = simulate(setup(inference=inf, max_inflight=8, mode="keep"))
    abort = simulate(setup(inference=inf, max_inflight=8, mode="abort"))
    assert abort.tokens == keep.tokens  # every sample still has its 100 tokens
    assert abort.step_s() > keep.step_s()  # the context prefilled again after each load


def test_a_sequence_aborted_twice_keeps_all_its_tokens():
    """A resubmitted sequence's context is its prompt and every token it decoded, not only those
    since its last resubmission (it was: a 1000-token sample aborted at 100 and 200 counted 900)."""
    inf = Inference(ITER_S, 0.0, 0.0, 10**6, 1e6, 0.0)  # 100 tokens a second; a prefill ~0 s
    done = []
    server = Server(0, inf, 10, [], itertools.count(), lambda now, g, s: done.append(g))
    group = Group(target=1, started=0.0, remaining=1, version=0)
    server.admit(0.0, group, [1000], 0)
    assert server.load(1.003, 0.0, 1) - 1.003 == pytest.approx(110 / 1e6)  # 100.3 tokens decoded
    assert server.load(2.006, 0.0, 2) - 2.006 == pytest.approx(210 / 1e6)  # 200.6
    while not done:
        now, _, handler, arg = heapq.heappop(server.events)
        handler(now, arg)
    assert (group.tokens, group.version) == (1000, 0)
    assert server.t == pytest.approx(10.006, abs=1e-3)  # 0.6 of a token was rounded up at 200.6


def test_a_server_with_more_gpus_than_kv_heads_holds_each_head_on_every_gpu_that_needs_it():
    """Qwen3-235B-A22B has 4 KV heads; at TP 16 each GPU holds one whole head (vLLM replicates
    them), so a token's KV is held, and read, 4 times over: a quarter of the tokens fit."""
    from simulate.hardware import Gpu, inference_for, kv_bytes_per_token, kv_capacity_tokens

    gpu, params, shape = Gpu(), 235e9, (94, 4, 128, 64)
    per_head = 94 * 2 * 128 * 2
    assert kv_bytes_per_token(params, shape, 1) == kv_bytes_per_token(params, shape, 4) == 4 * per_head
    assert kv_bytes_per_token(params, shape, 16) == 16 * per_head
    room = 0.9 * gpu.memory_bytes * 16 - 2 * params
    assert kv_capacity_tokens(params, gpu, 16, shape) == pytest.approx(room / (16 * per_head))
    server = inference_for(params, gpu, 16, shape=shape)
    bw = gpu.hbm_bytes_per_s * gpu.hbm_efficiency * 16
    attention = 4 * 94 * 64 * 128 / (gpu.peak_flops * gpu.compute_efficiency * 16)
    assert server.iter_per_kv_token_s == pytest.approx(16 * per_head / bw + attention)


def test_a_mixture_of_experts_costs_flops_by_its_active_parameters_and_memory_by_all():
    """Decode per sequence, prefill and training by the active parameters; the weights each decode
    iteration reads, the KV cache left beside them and the weight hand-off by all of them."""
    from simulate.hardware import Gpu, inference_for, kv_capacity_tokens, trainer_for

    gpu, total, active, shape = Gpu(), 30e9, 3e9, (48, 4, 128, 32)
    moe = inference_for(total, gpu, 2, 5000.0, active, shape)
    dense_total = inference_for(total, gpu, 2, 5000.0, shape=shape)
    dense_active = inference_for(active, gpu, 2, 5000.0, shape=shape)
    assert moe.iter_base_s == dense_total.iter_base_s  # reads all the weights
    assert (
        moe.iter_per_kv_token_s
        == dense_total.iter_per_kv_token_s
        == 48 * 2 * 4 * 128 * 2 / (2 * gpu.hbm_bytes_per_s * gpu.hbm_efficiency)
        + 4 * 48 * 32 * 128 / (2 * gpu.peak_flops * gpu.compute_efficiency)
    )
    assert moe.max_seqs == dense_total.max_seqs == int(kv_capacity_tokens(total, gpu, 2, shape) / 5000) < 256
    assert moe.iter_per_seq_s == dense_active.iter_per_seq_s == pytest.approx(dense_total.iter_per_seq_s / 10)
    assert moe.prefill_tokens_per_s == dense_active.prefill_tokens_per_s
    trainer = trainer_for(total, gpu, logprob_passes=1, active=active)
    assert trainer.train_s(10**6, 8) - trainer.overhead_s == pytest.approx(
        8 * active * 10**6 / (8 * gpu.peak_flops * gpu.mfu)
    )
    assert (
        trainer.publish_s()
        == trainer_for(total, gpu).publish_s()
        == 0.5 + 2 * total / gpu.handoff_bytes_per_s
    )
    from simulate.scenario import Scenario

    sc = Scenario(gpus=32, params=total, active_params=active, shape=shape, tp=2, max_tokens=4000)
    assert sc.colocated_sync().servers == 16 and sc.split(16, 1).inference == inference_for(
        total, gpu, 2, 512 + sc.lengths().mean(4000), active, shape
    )


def test_the_staleness_bound_is_the_orchestrators():
    for step in range(1, 12):
        for eta in range(5):
            assert pipeline.oldest_allowed_version(step, eta) == staleness.oldest_allowed_version(step, eta)


def test_line_fit_and_lengths_fit():
    assert line_fit([1, 2, 3], [3, 5, 7]) == pytest.approx((1.0, 2.0))
    assert line_fit([2, 2], [1.0, 3.0]) == (2.0, 0.0)
    assert line_fit([100, 105, 110], [0.5, 0.1, 0.6]) == (0.4, 0.0)  # 10% spread: noise, not a slope
    assert line_fit([1, 2, 3], [0.0, 0.0, 3.0]) == pytest.approx((0.0, 0.5))  # never a negative overhead
    lengths = Lengths(4000, 0.8, 16000)
    tail = 1 - 0.5 * math.erfc(-(math.log(16000) - math.log(4000)) / 0.8 / math.sqrt(2))
    fitted = fit_lengths(capped_mean(4000, 0.8, 16000), tail, 16000)
    assert fitted.sigma == pytest.approx(0.8, abs=0.051)
    assert fitted.median_tokens == pytest.approx(4000, rel=0.05)
    assert capped_mean(4000, 0.8, 16000) == pytest.approx(lengths.mean(50000), rel=0.02)


def test_parse_count():
    assert parse_count("7B") == 7e9 and parse_count("16k") == 16000 and parse_count("1.5b") == 1.5e9
    with pytest.raises(TriadError, match="is not a count"):
        parse_count("seven")


def test_cli_advice_and_its_errors(tmp_path):
    out = tmp_path / "advice.png"
    r = run_triad(
        "simulate",
        "--gpus",
        "8",
        "--model-size",
        "1.5B",
        "--max-tokens",
        "2k",
        "--batch-size",
        "8",
        "--group-size",
        "4",
        "--steps",
        "5",
        "--plot",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "best: max_async_level = " in r.stdout and "trainer's time (critical path): train" in r.stdout
    assert out.stat().st_size > 10_000
    r = run_triad("simulate")
    assert r.returncode == 2 and "give --gpus N" in r.stderr


def test_the_simulator_imports_no_service_and_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, simulate.advise, simulate.calibrate, simulate.plot, simulate.pipeline\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(top & {'torch', 'orchestrator', 'trainer', 'inference', 'services', 'vllm'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def synthetic_run(
    path, on_servers: int = 16, guard_slots: float | None = None, prompt_tokens: int | None = None
) -> None:
    """A run directory with 30 steps of known phase times (16 x 8 samples of ~7 tokens, 0.2 s a step),
    `on_servers` of the 16 slots on a server throughout and `guard_slots` left empty by the η guard
    (no guard metric at all: None, as in runs from before it was recorded). `prompt_tokens`: each
    sample's prompt, the rows' tokens its ~7 completion tokens more (None: no `completion_tokens`
    in the rows, as before they were recorded)."""
    from shared.rundir import INFERENCE, ORCHESTRATOR, TRAINER, RunDir

    rundir = RunDir(path)
    sampling, servers = {"max_tokens": 8}, {"urls": ["http://a"]}
    oc = {"batch_size": 16, "group_size": 8, "max_inflight": 16, "sampling": sampling, "servers": servers}
    config = {"max_async_level": 1, "orchestrator": oc}
    rundir.ensure_run(config)
    orch, trainer = rundir.metrics.writer(ORCHESTRATOR), rundir.metrics.writer(TRAINER)
    inference = rundir.metrics.writer(INFERENCE, "abc123")
    for step in range(1, 31):
        t = 100 + 0.2 * step
        spans = [[t - 0.2 + 0.1 * k, 0.1] for k in range(2) for _ in range(on_servers)]
        phases = dict(request_latency_s_p50=0.1, assemble_s=0.001, write_batch_s=0.015, request_spans=spans)
        if guard_slots is not None:
            phases.update(guard_wait_s=0.2, guard_idle_slot_s=0.2 * guard_slots)
        tokens = 860 + step % 3
        if prompt_tokens is not None:
            phases.update(completion_tokens=tokens)
            tokens += 128 * prompt_tokens
        orch.log(step, time=t, samples=128, samples_dropped=0, tokens=tokens, truncated_frac=0.01, **phases)
        trainer.log(step, time=t + 0.15, tokens=tokens, read_s=0.01, train_s=0.09, publish_s=0.04)
        inference.log(step, time=t + 0.18, version=step, load_s=0.03)


def test_calibration_reads_the_phases_of_a_run(tmp_path):
    from shared.rundir import RunDir
    from simulate.calibrate import calibrate, measured_outside_per_group, measured_samples_per_s

    synthetic_run(tmp_path)
    rundir = RunDir(tmp_path)
    assert measured_samples_per_s(rundir) == pytest.approx(640.0)
    assert measured_outside_per_group(rundir) == pytest.approx((0.0, 0.0))
    s = calibrate(rundir)
    assert s.trainer.train_s(860, 1) == pytest.approx(0.1) and s.trainer.train_s(5000, 1) == pytest.approx(
        0.1
    )
    assert s.trainer.publish_s() == pytest.approx(0.04)
    assert s.inference.load_s == pytest.approx(0.03) and s.batch_overhead_s == pytest.approx(0.016)
    assert (s.servers, s.batch_size, s.group_size, s.max_async_level) == (1, 16, 8, 1)
    assert s.group_overhead_s == pytest.approx(0.0, abs=0.005)  # every slot was on a server
    assert mean(simulate(s).latencies) == pytest.approx(0.1, rel=0.05)
    r = run_triad("simulate", "--from", str(tmp_path), "--steps", "20")
    assert r.returncode == 0, r.stderr
    assert "measured 640.0 samples/s at η=1" in r.stdout and "η=2:" in r.stdout


def test_calibration_fits_the_completion_under_its_cap_and_trains_the_prompt_too(tmp_path):
    """40-token prompts and ~7-token completions under `sampling.max_tokens = 8`: the lengths are
    the completions' (capped at 8, mean 6.7) and the prompt is the setup's; the trainer's tokens a
    step are both. Before 2026-11-29 the whole 47-token samples were fitted under the cap of 8."""
    from shared.rundir import RunDir
    from simulate.calibrate import setup_from_run

    synthetic_run(tmp_path, prompt_tokens=40)
    setup, _ = setup_from_run(RunDir(tmp_path))
    assert setup.prompt_tokens == 40
    assert setup.lengths.max_tokens == 8
    assert setup.lengths.mean() == pytest.approx(861 / 128, rel=0.03)
    step_tokens = setup.batch_size * setup.group_size * (setup.prompt_tokens + setup.lengths.mean())
    assert step_tokens == pytest.approx(861 + 128 * 40, rel=0.01)


def test_calibration_reads_a_run_recorded_before_the_orchestrator_had_tables():
    from simulate.calibrate import recorded

    now = {"batch_size": 16, "sampling": {"max_tokens": 8}, "servers": {"urls": ["http://a", "http://b"]}}
    before = {"batch_size": 16, "max_tokens": 8, "inference_urls": ["http://a", "http://b"]}
    for oc in (now, before):
        assert recorded(oc, "sampling.max_tokens") == 8
        assert recorded(oc, "servers.urls") == ["http://a", "http://b"]


def test_calibration_subtracts_the_eta_guards_empty_slots(tmp_path):
    """12 of 16 slots on a server, 2 held empty by the guard: the other 2 slots x 0.2 s per step,
    over 16 groups a step, are 0.025 s a group off the servers; the fit reproduces that. The same
    run without the guard's metric reads the guard's slots as overhead too (0.05 s)."""
    from shared.rundir import RunDir
    from simulate.calibrate import calibrate, measured_outside_per_group

    synthetic_run(tmp_path / "guard", on_servers=12, guard_slots=2)
    rundir = RunDir(tmp_path / "guard")
    assert measured_outside_per_group(rundir) == pytest.approx((0.025, 2 / 16))
    s = calibrate(rundir)
    assert simulate(s.with_(max_steps=30)).outside_per_group() == pytest.approx(0.025, rel=0.1)
    assert 0 < s.group_overhead_s <= 0.025
    synthetic_run(tmp_path / "old", on_servers=12)
    assert measured_outside_per_group(RunDir(tmp_path / "old")) == pytest.approx((0.05, 0.0))


def test_a_small_case_gives_exactly_what_it_gave_before_the_hot_paths_were_inlined():
    """The server's hot paths (finish, abort and resubmit; then sequences as heap tuples) were
    rewritten for speed with the same arithmetic in the same order: these are the figures of the
    code before, to the last bit. A change to the model itself changes them, and is then a change
    to say: a sequence aborted twice kept only the tokens since its last abort (the abort cases
    changed then); the trainer trains each sample's prompt tokens as well (every case changed then,
    then; a batch's `tokens` now counts the 128 x 512 prompt tokens); attention's FLOPs in decode and
    training changed every case to the figures here (with both set to zero the figures before
    came out to the last bit)."""
    from simulate.hardware import Gpu
    from simulate.scenario import Scenario

    old_rates = Gpu(hbm_efficiency=0.6, mfu=0.35)  # the rates these figures were made with (guesses then)
    sc = Scenario(
        gpus=16, params=7e9, max_tokens=8192, batch_prompts=16, group_size=8, steps=8, gpu=old_rates
    )
    r = simulate(sc.split(12, 2, "abort"))
    assert (r.samples_per_s(), r.written_at[8], r.dropped) == (2.0189191854754025, 421.21405168193604, 112)
    assert (sum(r.latencies), r.tokens[8]) == (11265.436410288803, 512179)
    r = simulate(sc.split(12, 1, "keep"))
    assert (r.samples_per_s(), r.written_at[8], r.dropped) == (1.6297079414678348, 572.1314757448118, 120)
    assert (sum(r.latencies), r.tokens[8]) == (10854.698825979958, 492162)
    r = simulate(sc.colocated_sync())
    assert (r.samples_per_s(), r.written_at[8]) == (1.2896176699908581, 789.3831735950745)
    # 5 sequences at most on a server: most samples wait for a place (`refill`)
    s = sc.split(12, 2, "abort")
    r = simulate(s.with_(inference=dataclasses.replace(s.inference, max_seqs=5), group_overhead_s=0.01))
    assert (r.samples_per_s(), r.written_at[8], r.dropped) == (1.4390670079049113, 715.9886030453308, 104)
    assert (sum(r.latencies), r.tokens[8]) == (22711.594053258454, 484126)


def test_an_end_shorter_than_the_clock_resolution_still_moves_the_clock():
    """Late in a long run (the clock at ~1.3e5 s) a last sequence's remainder of ~1e-9 tokens took
    less time than the float clock can tell from `now`: its end event fired at `now` again and
    again and the run never finished (AReaL's 16-GPU scaling setup, 60 steps, at the fitted
    rates). The end now lands on the next representable time."""
    from simulate.hardware import Gpu
    from simulate.scenario import Scenario

    sc = Scenario(
        gpus=16,
        params=7e9,
        max_tokens=31744,
        batch_prompts=512,
        group_size=16,
        steps=60,
        logprob_passes=1,
        gpu=Gpu(hbm_efficiency=0.83, mfu=0.293),
    )
    r = simulate(sc.colocated_sync())
    assert r.trained == 60 and 3400 < r.step_s() < 3800  # 3,582 s (3,000-3,500 before attention's FLOPs)


def test_advice_gives_the_gain_over_the_users_setting_and_the_range_the_held_out_rows_allow():
    import argparse
    import json
    from pathlib import Path

    from simulate import advise

    published = json.loads(Path("bench/results/simulate_published.json").read_text())
    held_out = [
        r["ratio"] for r in published["rows"] if r["split"].startswith("held out") and r["kind"] == "ratio"
    ]
    assert (round(min(held_out), 3), round(max(held_out), 3)) == advise.HELD_OUT_RATIO_ERROR
    assert advise.gain_range(2.0, (0.5, 1.25)) == (1.6, 4.0)
    args = argparse.Namespace(
        gpus=8,
        model_size="1.5B",
        active_size=None,
        max_tokens="2k",
        prompt_tokens="128",
        batch_size=8,
        group_size=4,
        steps=5,
        mode="keep",
        plot=None,
        current_eta=0,
        current_inference=4,
    )
    lines = advise.advise(args)
    sc = advise.scenario(args)
    mine = simulate(dataclasses.replace(sc.split(4, 0, "keep"), max_steps=5)).samples_per_s()
    gain = advise.search(sc, "keep")[0][0][0] / mine
    low, high = advise.gain_range(gain)
    assert (
        f"against your setting (max_async_level = 0, 4:4, {mine:.2f} samples/s): {gain:.2f}x predicted, "
        f"{low:.2f}x to {high:.2f}x" in "\n".join(lines)
    )
    with pytest.raises(TriadError, match="leaves no trainer"):
        advise.advise(argparse.Namespace(**{**vars(args), "current_inference": 8}))


def test_a_setup_occupies_its_scenarios_gpus_colocated_or_split():
    """A colocated pool is counted once: its servers and its trainer take turns on the same GPUs
    (NeMo-RL's tokens/s/GPU of a colocated run had been divided by twice its GPUs)."""
    from simulate.scenario import Scenario

    sc = Scenario(gpus=32, params=30.5e9, active_params=3.3e9, tp=2, max_tokens=4000)
    assert sc.colocated_sync().gpus == 32
    assert (sc.colocated_sync().servers, sc.colocated_sync().train_gpus) == (16, 32)
    assert sc.split(16, 1).gpus == 32
