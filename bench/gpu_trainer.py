"""The trainer alone on one device: triad's own update on a model of Qwen3-0.6B's shape.

    python -m bench.gpu_trainer OUT_DIR [--size qwen3-0.6b|toy] [--budget-s S] [--tokens 8192,16384,65536]

What runs is the trainer's own code, not a copy of it: `trainer.main.Trainer` (FSDP2 with bf16
parameters on CUDA, activation checkpointing and compiled blocks as configured), its
`train_step` (the packed forward with the output layer in chunks, the loss of `trainer/loss.py`, AdamW after
clipping) and its `Publisher` (a version as bf16 safetensors). The model is Qwen3-0.6B's own
config with seeded random weights (`tests/realsize.py`); `--size toy` shrinks its widths and
depth for a CPU test.

Each setting (tokens per update, one sequence or packed rows, activation checkpointing,
compile, attention) runs in its own process, so that one that runs out of memory is a row
of the table, not the end of the run. Per setting and length: one warm-up update (which
also compiles), then `TIMED` updates, their median time; tokens/s; MFU as prime-rl counts it
(`6 N` per token plus `6 L H d` per token and token of its row's context, against the chip's
dense bf16 peak); the peak of allocated memory. The checks: triad's forward (packed rows)
against a plain transformers forward, row by row in float32, on the same device, in fp32 and
in bf16 mixed precision; the losses on the device against the float64 references of
`tests/unit/test_loss.py`; the time to publish one version.

Results go to OUT_DIR/gpu_trainer.json as they come (a run stopped at its limit keeps
what it had), then OUT_DIR/gpu_trainer.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TIMED = 2  # timed updates per length, after one warm-up
PACKED_ROW_TOKENS = 2048  # rows of the packed layout (an RL batch's samples)
PROMPT_TOKENS = 64  # of each row (at most a quarter of it): no loss on them
# dense bf16 peak of the chips this bench names (NVIDIA's data sheets, SXM)
PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12}
TOY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    vocab_size=1024,
)


@dataclass(frozen=True)
class Setting:
    layout: str  # "one": one sequence per update; "packed": rows of PACKED_ROW_TOKENS
    checkpointing: bool
    compile: bool
    attention: str = "sdpa"

    @property
    def name(self) -> str:
        parts = [
            self.layout,
            "AC" if self.checkpointing else "no AC",
            "compiled" if self.compile else "eager",
        ]
        return ", ".join([*parts, self.attention])


CHECKS = ("losses", "forward", "publish")

SETTINGS = (  # most telling first: a run that reaches its budget drops the last ones
    Setting("one", checkpointing=True, compile=False),
    Setting("packed", checkpointing=True, compile=False),
    Setting("one", checkpointing=True, compile=True),
    Setting("packed", checkpointing=True, compile=False, attention="flex_attention"),
    Setting("one", checkpointing=False, compile=False),
)


def build_model(size: str, workdir: Path) -> Path:
    """The model directory: Qwen3-0.6B's shape from the real-size fixture, or its toy cut."""
    from tests.realsize import CONFIG, TOKENIZER_DIR, TOKENIZER_FILES, ensure_realsize_model, write_weights

    if size == "qwen3-0.6b":
        return ensure_realsize_model()
    dest = workdir / "toy-model"
    dest.mkdir(parents=True, exist_ok=True)
    config = {**json.loads(CONFIG.read_text()), **TOY_SHAPE}
    (dest / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_DIR / name, dest / name)
    write_weights(dest)
    return dest


def rows_of(tokens: int, layout: str, vocab: int, seed: int) -> list[dict]:
    """One update's rows, `tokens` in all: random token ids, no loss on each row's prompt, a
    sampler logprob near a random model's (-log vocab) and advantages of either sign."""
    import random

    rng = random.Random(seed)
    row_tokens = tokens if layout == "one" else min(PACKED_ROW_TOKENS, tokens // 2)
    lengths = [row_tokens] * (tokens // row_tokens)
    rows = []
    for i, length in enumerate(lengths):
        prompt = min(PROMPT_TOKENS, length // 4)
        mask = [False] * prompt + [True] * (length - prompt)
        rows.append(
            dict(
                input_ids=[rng.randrange(vocab) for _ in mask],
                loss_mask=mask,
                logprobs=[-12.0 if m else 0.0 for m in mask],
                advantage=rng.choice((-1.0, 1.0)) * rng.uniform(0.2, 1.0),
                sample_id=str(i),
            )
        )
    return rows


def model_flops(rows: list[dict], params: int, layers: int, attention_width: int) -> float:
    """Training FLOPs as prime-rl counts them: 6 N per token, plus causal attention's
    6 L (heads x head_dim) per token and token of its row."""
    lengths = [len(r["input_ids"]) for r in rows]
    return 6 * params * sum(lengths) + 6 * layers * attention_width * sum(n * n for n in lengths)


def peak_flops(device_name: str) -> float | None:
    return next((peak for chip, peak in PEAK_BF16_FLOPS.items() if chip in device_name), None)


def make_trainer(model_dir: Path, workdir: Path, setting: Setting, tokens: int, precision: str):
    """triad's trainer on this process's device (a one-rank group), configured for `setting`."""
    from shared.config import load_config
    from shared.liveness import Progress
    from shared.rundir import RunDir
    from trainer.main import Trainer
    from trainer.parallel import init_distributed

    sets = [
        f"run_dir={workdir / 'run'}",
        f"model={model_dir}",
        "trainer.checkpoint.every=0",
        "trainer.parallel.packing=true",
        f"trainer.parallel.micro_batch_tokens={tokens}",
        f"trainer.parallel.mixed_precision={precision}",
        f"trainer.parallel.activation_checkpointing={str(setting.checkpointing).lower()}",
        f"trainer.parallel.compile={str(setting.compile).lower()}",
        f"trainer.parallel.attention={setting.attention}",
    ]
    cfg = load_config(None, sets)
    device, mesh = init_distributed(cfg.trainer.device, cfg.trainer.collective_timeout_s)
    run_id = RunDir.of(cfg).ensure_run(cfg.public_dict()).run_id
    return Trainer(cfg, str(model_dir), device, mesh, Progress()), run_id


def peak_memory(device) -> int:
    """Bytes: the most CUDA memory allocated since the last reset, or on a CPU the process's peak RSS."""
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(setting: Setting, model_dir: Path, workdir: Path, lengths: list[int]) -> list[dict]:
    """Each length's row for `setting`, in this process; an out-of-memory length is a row too."""
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    trainer, _ = make_trainer(model_dir, workdir, setting, max(lengths), "auto")
    device = trainer.device
    params = sum(p.numel() for p in trainer.model.parameters())
    width = config.num_attention_heads * config.head_dim
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    peak = peak_flops(name)
    out = []
    try:
        for tokens in lengths:
            row = dict(setting=setting.name, **asdict(setting), tokens=tokens, device=name)
            try:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                times = []
                for step in range(1 + TIMED):
                    rows = rows_of(tokens, setting.layout, config.vocab_size, seed=step)
                    synchronize(device)
                    started = time.perf_counter()
                    stats = trainer.train_step(step + 1, rows, 1.0)
                    synchronize(device)
                    times.append(time.perf_counter() - started)
                step_s = statistics.median(times[1:])
                flops = model_flops(rows, params, config.num_hidden_layers, width)
                row.update(
                    warmup_s=round(times[0], 3),
                    step_s=round(step_s, 4),
                    tokens_per_s=round(tokens / step_s, 1),
                    mfu=None if peak is None else round(flops / step_s / peak, 4),
                    peak_gib=round(peak_memory(device) / 2**30, 2),
                    loss=round(stats["loss"], 5),
                    grad_norm=round(stats["grad_norm"], 4),
                )
            except torch.OutOfMemoryError as e:
                row.update(error="out of memory: " + str(e).split("\n")[0][:160])
                trainer.optimizer.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
            out.append(row)
    finally:
        dist.destroy_process_group()
    return out


def publish_time(model_dir: Path, workdir: Path, versions: int = 2) -> dict:
    """Seconds to publish a version as bf16 safetensors (gather, write, digest), each of `versions`;
    the process's peak host RSS before the first and after the last, beside the published model's size."""
    import resource

    import torch.distributed as dist

    trainer, run_id = make_trainer(model_dir, workdir, SETTINGS[0], 1024, "auto")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        times = []
        for version in range(1, versions + 1):
            synchronize(trainer.device)
            started = time.perf_counter()
            published = trainer.publisher.publish(version, run_id, files=True)
            times.append(time.perf_counter() - started)
        return dict(
            publish_s=[round(t, 3) for t in times],
            dtype=str(trainer.publisher.dtype),
            phases={"gather_s": published.gather_s, "write_s": published.write_s},
            digest_s=round(published.digest_s, 3),
            host_peak_before_gib=round(before / 2**20, 2),
            host_peak_gib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            model_gib=round(
                sum(p.numel() for p in trainer.model.parameters()) * trainer.publisher.dtype.itemsize / 2**30,
                2,
            ),
        )
    finally:
        dist.destroy_process_group()


def forward_check(model_dir: Path, workdir: Path, tokens: int, precision: str) -> dict:
    """triad's packed forward (`Trainer.logprobs_of`, before any update) against a plain
    transformers forward of each row alone in float32 on the same device: the largest and the
    mean absolute difference of the loss tokens' logprobs."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    setting = Setting("packed", checkpointing=False, compile=False)
    trainer, _ = make_trainer(model_dir, workdir, setting, tokens, precision)
    try:
        device = trainer.device
        rows = rows_of(tokens, "packed", trainer.model.config.vocab_size, seed=7)
        trainer.model.eval()
        ours = trainer.logprobs_of(trainer.model, rows, 1.0).float().cpu()
        plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
        diffs = []
        with torch.no_grad():
            for i, row in enumerate(rows):
                ids = torch.tensor([row["input_ids"]], device=device)
                logits = plain(input_ids=ids, use_cache=False).logits.float()
                logp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0].cpu()
                mask = torch.tensor(row["loss_mask"][1:])
                diffs.append((ours[i, 1 : len(row["input_ids"])] - logp)[mask].abs())
        every = torch.cat(diffs)
        return dict(
            precision=precision,
            rows=len(rows),
            tokens=tokens,
            max_abs=float(every.max()),
            mean_abs=float(every.mean()),
        )
    finally:
        dist.destroy_process_group()


def loss_check(device_name: str) -> dict:
    """The losses of `trainer/loss.py` on the device against the float64 references of the unit
    tests (computed on the CPU): the largest difference of loss and gradient over every spec
    and seed, in float64 and in float32."""
    import torch

    from tests.unit.test_loss import DECOUPLED, SPECS, random_batch, reference_loss
    from trainer.loss import BatchTotals, policy_loss

    device = torch.device(device_name)
    worst = {"float64": [0.0, 0.0], "float32": [0.0, 0.0]}
    cases = 0
    for spec in (*SPECS, *DECOUPLED):
        for seed in (0, 1):
            lp, lq, adv, mask = random_batch(seed)
            gen = torch.Generator().manual_seed(100 + seed)
            prox = lp.detach() + torch.randn(lp.shape, generator=gen, dtype=torch.float64) * 0.2
            ref = lp.detach() + torch.randn(lp.shape, generator=gen, dtype=torch.float64) * 0.3
            uses = spec in DECOUPLED
            want = reference_loss(
                lp, lq, adv, mask, spec, prox=prox if uses else None, ref=ref if uses else None
            )
            (want_grad,) = torch.autograd.grad(want, lp)
            for dtype, name in ((torch.float64, "float64"), (torch.float32, "float32")):
                x = lp.detach().to(device, dtype).requires_grad_()
                on = {k: v.to(device, dtype) for k, v in dict(lq=lq, prox=prox, ref=ref).items()}
                got = policy_loss(
                    x,
                    on["lq"],
                    adv.to(device, dtype),
                    mask.to(device),
                    spec,
                    BatchTotals(lp.shape[0], int(mask.sum())),
                    logp_prox=on["prox"] if uses else None,
                    logp_ref=on["ref"] if uses else None,
                )
                (grad,) = torch.autograd.grad(got.loss, x)
                worst[name][0] = max(worst[name][0], abs(got.loss.item() - want.item()))
                worst[name][1] = max(worst[name][1], float((grad.cpu().double() - want_grad).abs().max()))
            cases += 1
    return dict(
        device=device_name,
        cases=cases,
        **{f"{k}_max_loss_diff": v[0] for k, v in worst.items()},
        **{f"{k}_max_grad_diff": v[1] for k, v in worst.items()},
    )


def child(args: argparse.Namespace) -> None:
    """One job in this process; its JSON on stdout's last line."""
    model_dir, workdir = Path(args.model_dir), Path(args.workdir)
    job = args.child
    if job == "measure":
        result = measure(Setting(**json.loads(args.setting)), model_dir, workdir, args.lengths)
    elif job == "forward":
        result = [forward_check(model_dir, workdir / p, args.lengths[0], p) for p in ("fp32", "bf16")]
    elif job == "publish":
        result = publish_time(model_dir, workdir)
    else:
        import torch

        result = loss_check("cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps(result))


def run_job(
    job: str, model_dir: Path, workdir: Path, lengths: list[int], setting: Setting | None, timeout_s: float
) -> object:
    """A job in its own process (its own one-rank group and memory); its error's last line if it fails."""
    cmd = [
        sys.executable,
        "-m",
        "bench.gpu_trainer",
        "--child",
        job,
        "--model-dir",
        str(model_dir),
        "--workdir",
        str(workdir),
        "--lengths",
        *map(str, lengths),
    ]
    if setting is not None:
        cmd += ["--setting", json.dumps(asdict(setting))]
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        return dict(error=f"stopped after {timeout_s:.0f} s: the bench's time budget")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return dict(error=f"exit {done.returncode}: {tail[:300]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: Path) -> str:
    """bench/results/gpu_trainer.md: the GPU run (`gpu_trainer.json`), the commit before it in the
    same device calls (`gpu_trainer_before.json`), an H200's run (`gpu_trainer_h200.json`) and the
    CPU run (`gpu_trainer_cpu.json`) of this bench, each table with its device, date, command and
    commit."""
    parts = [
        "# The trainer alone on one device: triad's update at Qwen3-0.6B's shape",
        "",
        "Generated by `python -m bench.gpu_trainer --report` from the result files beside it. "
        "Reference: prime-rl's trainer on one H100 (FA3, one 64K sequence): 10,147 tokens/s, "
        "MFU 26.8%, 19.6 GiB (its `benchmarks/results`). MFU counts as prime-rl does "
        "(`model_flops`); a CPU has no peak here, so no MFU.",
    ]
    for name, title in (
        ("gpu_trainer.json", "On the GPU"),
        ("gpu_trainer_before.json", "On the GPU, in the same device calls, before the chunked output layer"),
        ("gpu_trainer_h200.json", "On an H200: 64K without activation checkpointing, and the publish"),
        ("gpu_trainer_cpu.json", "On this machine's CPU"),
    ):
        path = results / name
        if path.is_file():
            r = json.loads(path.read_text())
            parts += ["", f"## {title}: {r['date']}, `{r['command']}`", ""]
            if "commit" in r:
                parts += [f"commit: {r['commit']}", ""]
            parts.append(table(r))
            for again in r.get("reruns", []):
                device = {k: r[k] for k in ("size", "cuda_device", "cpus", "torch", "transformers")}
                parts += ["", f"### Again: {again['date']}, `{again['command']}`", ""]
                if "commit" in again:
                    parts += [f"commit: {again['commit']}", ""]
                parts.append(table(device | again))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--size", choices=("qwen3-0.6b", "toy"), default="qwen3-0.6b")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting settings after this")
    parser.add_argument("--tokens", default="8192,16384,65536", help="tokens per update")
    parser.add_argument("--settings", default=None, help="indices into SETTINGS to run (default: all)")
    parser.add_argument(
        "--checks", default=",".join(CHECKS), help=f"which of {','.join(CHECKS)} to run ('' for none)"
    )
    parser.add_argument("--report", action="store_true", help="write bench/results/gpu_trainer.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--lengths", nargs="*", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return {}
    if args.report:
        results = Path(__file__).resolve().parent / "results"
        (results / "gpu_trainer.md").write_text(report(results))
        return {}
    checks = [c for c in args.checks.split(",") if c]
    if unknown := set(checks) - set(CHECKS):
        parser.error(f"--checks: no check {', '.join(sorted(unknown))}; choose from {', '.join(CHECKS)}")
    started = time.monotonic()
    lengths = [int(t) for t in args.tokens.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-trainer-"))
    result: dict = dict(
        size=args.size,
        lengths=lengths,
        python=platform.python_version(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command="python -m bench.gpu_trainer " + " ".join(argv if argv is not None else sys.argv[1:]),
        load_average=os.getloadavg()[0],
    )
    result.update(versions())

    def save() -> None:
        (args.out / "gpu_trainer.json").write_text(json.dumps(result, indent=1))

    model_dir = build_model(args.size, scratch)
    result["model_build_s"] = round(time.monotonic() - started, 1)
    save()

    def left() -> float:
        return args.budget_s - (time.monotonic() - started)

    if "losses" in checks:
        result["losses"] = run_job("losses", model_dir, scratch / "losses", lengths, None, left())
        save()
    if "forward" in checks:
        result["forward"] = run_job("forward", model_dir, scratch / "forward", [min(lengths)], None, left())
        save()
    result["settings"] = []
    chosen = list(range(len(SETTINGS)))
    if args.settings is not None:
        chosen = [int(i) for i in args.settings.split(",") if i]
    for i in chosen:
        setting = SETTINGS[i]
        rows = run_job("measure", model_dir, scratch / f"s{i}", lengths, setting, left())
        result["settings"].append(dict(setting=setting.name, rows=rows))
        save()
    if "publish" in checks:
        result["publish"] = run_job("publish", model_dir, scratch / "publish", lengths, None, left())
    result["total_s"] = round(time.monotonic() - started, 1)
    save()
    (args.out / "gpu_trainer.md").write_text(table(result))
    shutil.rmtree(scratch, ignore_errors=True)
    return result


def versions() -> dict:
    import torch
    import transformers

    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return dict(
        torch=torch.__version__, transformers=transformers.__version__, cuda_device=cuda, cpus=os.cpu_count()
    )


def table(result: dict) -> str:
    """The results as markdown: one row per setting and length."""
    lines = [
        f"device: {result.get('cuda_device') or 'CPU'} ({result.get('cpus')} CPUs), "
        f"torch {result.get('torch')}, "
        f"transformers {result.get('transformers')}, model {result['size']}",
        "",
        "| setting | tokens | step s | tokens/s | MFU | peak GiB (CUDA allocated; CPU: RSS) | warm-up s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for entry in result.get("settings", []):
        rows = entry["rows"]
        if isinstance(rows, dict):  # the whole setting failed
            lines.append(f"| {entry['setting']} | | {rows['error']} | | | | |")
            continue
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['setting']} | {r['tokens']} | {r['error']} | | | | |")
                continue
            mfu = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            lines.append(
                f"| {r['setting']} | {r['tokens']} | {r['step_s']} | {r['tokens_per_s']:,.0f} | {mfu} "
                f"| {r['peak_gib']} | {r['warmup_s']} |"
            )
    for key, title in (("forward", "forward check"), ("losses", "losses"), ("publish", "publish")):
        if key in result:
            lines += ["", f"{title}: {json.dumps(result[key])}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
