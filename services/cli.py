"""The `triad` command.

    triad up [-c cfg.toml] [--set key=value ...]      all three services on this node
    triad inference -c cfg.toml [--join]              vLLM + /admin routes (--join: join a running run)
    triad orchestrator -c cfg.toml                    rollouts -> run_dir/rollouts
    torchrun --nproc-per-node N -m services.cli trainer -c cfg.toml
    triad status RUN_DIR [--last N]                   where each service is, where the time went
    triad plot RUN_DIR [--window A:B]                 reward, lag, throughput -> RUN_DIR/plot.png,
                                                      a timeline of steps A..B -> RUN_DIR/timeline.png
    triad merge-lora RUN_DIR [--version V] OUT_DIR    the run's LoRA adapter merged into its base model,
                                                      as a Hugging Face directory
    triad simulate [--advise] --gpus N --model-size 7B --max-tokens 16k [--plot out.png]
                   [--current-eta E --current-inference G]
                                                      the best max_async_level and inference:training
                                                      split, from a model of the pipeline, and its gain
                                                      over your setting with its range (docs/simulate.md)
    triad simulate --from RUN_DIR                     that model calibrated on a run: samples/s at η 0, 1, 2

Config is parsed before anything heavy is imported, so a bad key fails in
a fraction of a second with one line that names it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from inference.server_children import defer_in_a_spawned_process
from shared.config import TriadConfig, load_config
from shared.errors import TriadError
from shared.heap import defer_full_collections
from shared.logs import setup_logging
from shared.rundir import INFERENCE, ORCHESTRATOR, TRAINER, RunDir

EMBEDDED_DEFAULT = Path(__file__).with_name("embedded_default.toml")
PARENT_PID = os.getppid()  # a trainer worker's launcher (torchrun), read before anything slow
defer_in_a_spawned_process()  # vLLM's spawned processes import this module before vLLM


def run_up(cfg: TriadConfig, args: argparse.Namespace) -> None:
    from services.up import run_up as up

    up(cfg, args.config, args.overrides)


def run_inference(cfg: TriadConfig, args: argparse.Namespace) -> None:
    defer_full_collections()  # until the service has started (shared/heap.py)
    from services.models import resolve_model, served_as_hub_id

    model = resolve_model(cfg.model, cfg.model_revision)
    from inference.server import run_inference as serve

    serve(served_as_hub_id(cfg), model, join=args.join)


def run_orchestrator(cfg: TriadConfig, _: argparse.Namespace) -> None:
    defer_full_collections()  # until the service has started (shared/heap.py)
    from orchestrator.loop import run_orchestrator as orchestrate

    orchestrate(cfg)


def run_trainer(cfg: TriadConfig, _: argparse.Namespace) -> None:
    defer_full_collections()  # until the service has started (shared/heap.py)
    from services.models import resolve_model
    from trainer.host import die_with_launcher

    die_with_launcher(PARENT_PID)

    model = resolve_model(cfg.model, cfg.model_revision)
    from trainer.main import run_trainer as train

    train(cfg, model)


COMMANDS: dict[str, Callable[[TriadConfig, argparse.Namespace], None]] = {
    "up": run_up,
    INFERENCE: run_inference,
    ORCHESTRATOR: run_orchestrator,
    TRAINER: run_trainer,
}


def run_status(args: argparse.Namespace) -> None:
    from services.report import status_lines

    print("\n".join(status_lines(RunDir(args.run_dir), last_n=args.last)))


def run_plot(args: argparse.Namespace) -> None:
    from services.report import plot_run, plot_timeline, step_window

    rundir = RunDir(args.run_dir)
    print(plot_run(rundir))
    print(plot_timeline(rundir, *step_window(rundir, args.window)))


def base_model(rundir: RunDir, given: str | None) -> str:
    """The model the run trained (its run record's `model`), or `given`, resolved to a loadable one."""
    from services.models import resolve_model

    recorded = {} if given else rundir.read_run().config
    spec = given or recorded.get("model")
    if spec is None:
        raise TriadError(f"the run record of {rundir.name} names no model: pass --base MODEL")
    try:
        return resolve_model(spec, recorded.get("model_revision"))
    except TriadError as e:
        raise TriadError(f"base model of {rundir.name}: {e} (pass --base MODEL)") from None


def run_merge_lora(args: argparse.Namespace) -> None:
    from trainer.merge import merge_lora

    rundir = RunDir(args.run_dir)
    version = merge_lora(rundir, base_model(rundir, args.base), args.out_dir, args.version)
    print(f"merged adapter version {version} of {rundir.name} into {args.out_dir}")


def run_simulate(args: argparse.Namespace) -> None:
    from simulate.advise import advise, from_run

    if args.from_run is None and args.gpus is None:
        raise TriadError("give --gpus N (with --model-size and --max-tokens) or --from RUN_DIR")
    if args.advise and args.from_run is not None:
        raise TriadError("--advise plans a cluster (--gpus N); --from RUN_DIR predicts a run: give one")
    print("\n".join(from_run(args) if args.from_run else advise(args)))


def simulate_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="from_run", metavar="RUN_DIR", help="calibrate on this run and predict it")
    p.add_argument("--gpus", type=int, help="GPUs in all (inference and training)")
    p.add_argument(
        "--advise",
        action="store_true",
        help="the η and split to use for --gpus, against --current-eta / --current-inference",
    )
    p.add_argument("--model-size", default="7B", help="parameters (e.g. 1.5B, 7B, 32B; all of a MoE's)")
    p.add_argument("--active-size", help="a mixture of experts' active parameters (e.g. 3B)")
    p.add_argument("--prompt-tokens", default="512", help="prompt length (e.g. 512, 2k)")
    p.add_argument("--current-eta", type=int, default=0, help="your max_async_level now")
    p.add_argument(
        "--current-inference",
        type=int,
        help="your inference GPUs now (the rest train); default: one synchronous pool of all",
    )
    p.add_argument("--max-tokens", default="16k", help="completion length cap (e.g. 8k, 16k)")
    p.add_argument("--batch-size", type=int, default=512, help="prompt groups per step")
    p.add_argument("--group-size", type=int, default=16, help="samples per prompt")
    p.add_argument(
        "--mode",
        choices=("keep", "abort"),
        default="keep",
        help="in-flight weight update: pause and keep (triad) or abort and resubmit",
    )
    p.add_argument("--steps", type=int, default=12, help="steps simulated per candidate")
    p.add_argument("--plot", help="write the best candidate's timeline and utilisation to this PNG")


RUN_DIR_COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "status": run_status,
    "plot": run_plot,
    "merge-lora": run_merge_lora,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triad", description="asynchronous RL post-training")
    sub = p.add_subparsers(dest="command", required=True)
    for name in RUN_DIR_COMMANDS:
        sub.add_parser(name).add_argument("run_dir", type=str)
    sub.choices["status"].add_argument("--last", type=int, default=20, help="steps the time breakdown covers")
    sub.choices["plot"].add_argument("--window", help="FIRST:LAST steps of the timeline (default: last 10)")
    merge = sub.choices["merge-lora"]
    merge.add_argument("out_dir", type=Path, help="a new (or empty) directory for the merged model")
    merge.add_argument("--version", type=int, help="the adapter version (default: the newest published)")
    merge.add_argument("--base", help="the base model, if not the one the run records")
    simulate_parser(sub.add_parser("simulate", help="model the pipeline: best η and split, or a run's"))
    for name in COMMANDS:
        s = sub.add_parser(name)
        s.add_argument("-c", "--config", type=Path, help="TOML config file")
        s.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config key (dotted for tables: trainer.optim.lr=1e-5)",
        )
        if name == INFERENCE:
            s.add_argument(
                "--join",
                action="store_true",
                help="register with the run's fleet so a running orchestrator discovers this server",
            )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    setup_logging()
    try:
        if args.command in RUN_DIR_COMMANDS:
            return RUN_DIR_COMMANDS[args.command](args)
        if args.command == "simulate":
            return run_simulate(args)
        if args.command == "up" and args.config is None:
            args.config = EMBEDDED_DEFAULT
        cfg = load_config(args.config, args.overrides)
        COMMANDS[args.command](cfg, args)
    except TriadError as e:
        print(f"triad {args.command}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
