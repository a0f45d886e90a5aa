"""`triad simulate`: the advice (best η and split for a cluster) and the calibrated predictions
(`--from RUN_DIR`), as lines to print."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from shared.errors import TriadError
from simulate.pipeline import simulate
from simulate.result import Result
from simulate.scenario import Scenario
from simulate.setup import Setup, parse_count

ETAS = (0, 1, 2, 4)  # past 4, AReaL's scores drop (η = 8: 41.0, 16: 38.7 against 42.2 at 4)
FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
# The model's speedups over published ones on the held-out ratio rows of every set (predicted /
# published, lowest and highest; bench/results/simulate_published.json, a unit test holds the two
# equal): a predicted gain g is then sure to lie between g / high and g / low as far as those rows tell
HELD_OUT_RATIO_ERROR = (0.337, 1.338)


def summary(result: Result) -> list[str]:
    path = ", ".join(f"{k} {v:.0%}" for k, v in result.critical_path().items())
    util = ", ".join(f"{k} {v:.0%}" for k, v in result.utilisation().items())
    return [
        f"  {result.samples_per_s():.2f} samples/s, {result.tokens_per_s():.0f} tokens/s, "
        f"{result.step_s():.2f} s/step, {result.dropped} samples dropped as stale, "
        f"{result.guard_share():.0%} of the slots held empty by the η guard",
        f"  trainer's time (critical path): {path}",
        f"  utilisation: {util}",
    ]


def search(sc: Scenario, mode: str) -> tuple[list[tuple[float, int, int]], dict[tuple[int, int], Result]]:
    """samples/s for every η and split (inference GPUs), best first."""
    results: dict[tuple[int, int], Result] = {}
    for eta in ETAS:
        for fraction in FRACTIONS:
            inference = int(sc.gpus * fraction)
            try:
                setup = replace(sc.split(inference, eta, mode), max_steps=max(sc.steps, 4 * (eta + 1)))
            except TriadError:
                continue
            results[(eta, inference)] = simulate(setup)
    ranked = sorted(((r.samples_per_s(), eta, inf) for (eta, inf), r in results.items()), reverse=True)
    return ranked, results


def scenario(args: argparse.Namespace) -> Scenario:
    return Scenario(
        gpus=args.gpus,
        params=parse_count(args.model_size),
        max_tokens=int(parse_count(args.max_tokens)),
        batch_prompts=args.batch_size,
        group_size=args.group_size,
        steps=args.steps,
        prompt_tokens=int(parse_count(args.prompt_tokens)),
        active_params=parse_count(args.active_size) if args.active_size else 0.0,
    )


def current(sc: Scenario, args: argparse.Namespace) -> tuple[str, Result]:
    """The user's setting: `--current-inference` GPUs serving at `--current-eta`, or (neither given)
    one synchronous pool of all the GPUs (verl's and NeMo-RL's colocated layout)."""
    if args.current_inference is None:
        return f"one synchronous pool of all {sc.gpus} GPUs", simulate(sc.colocated_sync())
    setup = sc.split(args.current_inference, args.current_eta, args.mode)
    steps = max(sc.steps, 4 * (args.current_eta + 1))
    serving = args.current_inference
    name = f"max_async_level = {args.current_eta}, {serving}:{sc.gpus - serving}"
    return name, simulate(replace(setup, max_steps=steps))


def gain_range(gain: float, error: tuple[float, float] = HELD_OUT_RATIO_ERROR) -> tuple[float, float]:
    """The gain a prediction of `gain` is sure of: the model's speedups ran `error` (lowest, highest)
    times the published ones on the held-out rows."""
    low, high = error
    return gain / high, gain / low


def advise(args: argparse.Namespace) -> list[str]:
    sc = scenario(args)
    ranked, results = search(sc, args.mode)
    if not ranked:
        raise TriadError(
            f"simulate: no split of {args.gpus} GPUs fits a {args.model_size} server and a trainer"
        )
    rate, eta, inference = ranked[0]
    best = results[(eta, inference)]
    setting, now = current(sc, args)
    gain = rate / max(now.samples_per_s(), 1e-12)
    low, high = gain_range(gain)
    lines = [
        f"{args.gpus} GPUs, {args.model_size} model, up to {args.max_tokens} tokens, "
        f"{args.batch_size}x{args.group_size} samples per step, {args.prompt_tokens}-token prompts "
        f"({args.mode} in-flight updates):",
        f"best: max_async_level = {eta}, {inference} GPUs inference : {args.gpus - inference} training "
        f"(tp {best.setup.inference.tp}, {best.setup.servers} servers)",
        *summary(best),
        f"against your setting ({setting}, {now.samples_per_s():.2f} samples/s): {gain:.2f}x predicted, "
        f"{low:.2f}x to {high:.2f}x as sure as the held-out checks (the model's speedups were "
        f"{HELD_OUT_RATIO_ERROR[0]:.2f} to {HELD_OUT_RATIO_ERROR[1]:.2f} of the published ones)",
        "next best: " + "; ".join(f"η={e}, {i}:{args.gpus - i} {r:.2f}/s" for r, e, i in ranked[1:5]),
    ]
    if args.plot:
        from simulate.plot import plot

        split = f"{inference}:{args.gpus - inference}"
        title = (
            f"triad simulate: {args.gpus} GPUs, {args.model_size}, {args.max_tokens} tokens, η={eta}, "
            + split
        )
        lines.append(f"plot: {plot(best, Path(args.plot), title)}")
    return lines


def from_run(args: argparse.Namespace) -> list[str]:
    from shared.rundir import RunDir
    from simulate.calibrate import calibrate, measured_samples_per_s

    rundir = RunDir(args.from_run)
    setup: Setup = calibrate(rundir)
    lines = [
        f"calibrated on {args.from_run}: measured {measured_samples_per_s(rundir):.1f} samples/s "
        f"at η={setup.max_async_level}",
        f"  fitted: decode iteration {setup.inference.iter_base_s * 1e3:.2f} ms, per-group overhead "
        f"{setup.group_overhead_s * 1e3:.1f} ms, load {setup.inference.load_s * 1e3:.1f} ms, "
        f"batch write {setup.batch_overhead_s * 1e3:.1f} ms, trainer {setup.trainer.overhead_s * 1e3:.1f} ms "
        f"+ {setup.trainer.train_s(1000, 1) - setup.trainer.overhead_s:.4f} s per 1000 tokens, publish "
        f"{setup.trainer.publish_s() * 1e3:.1f} ms; lengths median {setup.lengths.median_tokens:.1f}, "
        f"sigma {setup.lengths.sigma:.2f}, cap {setup.lengths.max_tokens}",
        f"  measured: {setup.notes['calibration']}",
    ]
    for eta in ETAS[:3]:
        r = simulate(replace(setup, max_async_level=eta, max_steps=args.steps))
        lines.append(f"η={eta}:")
        lines += summary(r)
    for servers in (2, 4):
        r = simulate(replace(setup, servers=servers, max_steps=args.steps))
        lines.append(f"{servers} servers at η={setup.max_async_level}: {r.samples_per_s():.1f} samples/s")
    return lines
