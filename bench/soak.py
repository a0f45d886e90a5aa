"""The fault soak: a run on its worst day reaches its last step, loses nothing and counts every fault.

    python -m bench.soak WORKDIR [--only default chat] [--steps default=1000 chat=60] [--share 0.03]

Each scenario runs the three services as separate processes on one run directory, as a fleet
would, with three kinds of trouble at once:
(a) `bench/fault_proxy.py` in front of vLLM spoils `--share` of generation, render and derender
    calls (500, 503, 429, 400, a cut body, a dropped connection, a stall past the request bound);
(b) the environment (`bench/soak_envs.py`) makes its reward, respond and tool hang past
    `orchestrator.environment.timeout_s`, raise, or return a megabyte, on `--share` of calls;
(c) inference is killed (kill -9, engine and worker included) and restarted twice, at a third and
    two thirds of the steps.
Scenarios: `default`, the embedded default (addition on the 0.5M model); `chat`, the chat
calculator on the embedded chat model (`configs/tiny-tools.toml`); and `single_call`, the same
served with Llama 3.1's chat template (vendored, `shared/data/templates/`) and vLLM's `llama3_json`
parser, where the proxy also turns a share of parsed turns into turns that ask for two calls at
once (`two_calls`), which that template refuses to render: each such episode must end truncated.
Checked for each: every service exits 0 on its own, the trainer trains steps 1..N exactly once,
every batch's samples obey max_async_level, no log holds a traceback, and every injected fault is
counted in the orchestrator's metrics under its cause. Results: bench/results/soak.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from bench.fault_proxy import ANSWER_FAULTS, COUNTED_AS, counted_as
from bench.soak_envs import COUNTS_VAR
from bench.suite import REPO, RESULTS
from shared.net import free_port
from shared.rundir import ORCHESTRATOR, TRAINER, RunDir
from tests.helpers import CHAT_VLLM_ARGS, Server, server_tracebacks, trainer_cmd, triad_cmd

SCENARIOS = {
    "default": {
        "config": "services/embedded_default.toml",
        "env": "bench.soak_envs:faulty_addition",
        "steps": 1000,
        "vllm_args": (),
        "request_timeout_s": 10,
    },
    "chat": {
        "config": "configs/tiny-tools.toml",
        "env": "bench.soak_envs:faulty_calculator",
        "steps": 60,
        "vllm_args": CHAT_VLLM_ARGS,
        # unstreamed, 100 chat requests in flight on 2 cores took p90 9-10 s each, and a 10 s bound
        # on the whole request timed out healthy ones by the hundred a step (soak of 2026-11-26,
        # stopped at step 25 of 60). Streamed, the bound is on each chunk (the first token, then
        # every 16 tokens), and at 93-99 requests running vLLM generated 117-147 tokens/s in all:
        # 16 tokens of one request took 11-13 s, so a 10 s bound still timed out healthy requests
        # (soak of 2026-11-27, stopped at step 18). 40 s allows 0.4 tokens/s per request.
        "request_timeout_s": 40,
    },
    "single_call": {
        "config": "configs/tiny-tools.toml",
        "env": "bench.soak_envs:faulty_calculator",
        "steps": 30,
        "vllm_args": (),
        "template": "llama3_1",
        "request_timeout_s": 40,
        "two_calls": {"name": "calculate", "arguments": {"expression": "2*3+4"}},
        "refusal": "only supports single tool-calls",  # Llama 3.1's template, raised in its render
    },
}
COUNTED = ("requests_failed", "groups_failed", "episodes_truncated", "episodes_dropped", "env_calls_overran")
ENV_CALLS = ("env_calls_overran", "env_calls_waited", "env_calls_not_started")
STALL_S = 600.0  # no trained step for this long: the soak has failed (a wedged run)
ETA = 1


class Soak:
    def __init__(self, root: Path, name: str, steps: int, share: float) -> None:
        self.root, self.name, self.steps, self.share = root, name, steps, share
        self.spec = SCENARIOS[name]
        self.run_dir = root / "run"
        self.proxy_port = free_port()
        self.proxy_counts = root / "proxy_counts.json"
        self.env_counts = root / "env_counts.json"
        self.procs: dict[str, subprocess.Popen] = {}
        self.server: Server | None = None
        self.server_port = free_port()
        self.restarts: list[int] = []
        self.model = tomllib_model(self.spec["config"])

    def sets(self) -> list[str]:
        return [
            f"run_dir={self.run_dir}",
            f"model={self.model}",
            f"max_steps={self.steps}",
            f"max_async_level={ETA}",
            f"orchestrator.environment.name={self.spec['env']}",
            f'orchestrator.servers.urls=["http://127.0.0.1:{self.proxy_port}"]',
            f"inference.port={self.server_port}",
            "orchestrator.environment.timeout_s=5",
            f"orchestrator.servers.request_timeout_s={self.spec['request_timeout_s']}",
            "orchestrator.servers.retry_backoff_s=0.2",
            "orchestrator.eval.every=0",
            "trainer.checkpoint.every=50",
        ]

    def flags(self) -> list[str]:
        return ["-c", self.spec["config"], *[f"--set={s}" for s in self.sets()]]

    def start_server(self) -> None:
        extra = (
            [f"inference.vllm_args={json.dumps(list(self.spec['vllm_args']))}"]
            if self.spec["vllm_args"]
            else []
        )
        self.server = Server(
            self.run_dir,
            self.model,
            self.root / "inference.log",
            *extra,
            f"max_steps={self.steps}",
            port=self.server_port,
        )
        self.server.wait_healthy(600)

    def start(self, service: str, cmd: list[str], env: dict | None = None) -> None:
        log = open(self.root / f"{service}.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.procs[service] = subprocess.Popen(
            cmd, cwd=REPO, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT
        )

    def trained(self) -> list[int]:
        return [r["step"] for r in RunDir(self.run_dir).metrics.rows(TRAINER)]

    def run(self) -> dict:
        self.root.mkdir(parents=True, exist_ok=True)
        if "template" in self.spec:
            self.model = str(dressed(self.model, self.spec["template"], self.root / "model"))
        started = time.time()
        self.start_server()
        proxy = [sys.executable, "-m", "bench.fault_proxy", "--listen", f"127.0.0.1:{self.proxy_port}"]
        proxy += [
            "--upstream",
            self.server.url,
            "--share",
            str(self.share),
            "--counts",
            str(self.proxy_counts),
        ]
        stall_s = 2 * self.spec["request_timeout_s"]  # a stall outlasts the request bound: a timeout
        proxy += ["--stall-s", str(stall_s)]
        if "two_calls" in self.spec:
            proxy += ["--two-calls", json.dumps(self.spec["two_calls"])]
        self.start("proxy", proxy)
        env = {COUNTS_VAR: str(self.env_counts), "TRIAD_SOAK_SHARE": str(self.share)}
        self.start("orchestrator", triad_cmd("orchestrator", *self.flags()), env)
        self.start("trainer", trainer_cmd(*self.flags()))
        self.follow()
        outcome = self.check(time.time() - started)
        self.stop()
        return outcome

    def follow(self) -> None:
        """Until the trainer and orchestrator exit: restart inference at a third and two thirds."""
        restart_at = [self.steps // 3, 2 * self.steps // 3]
        last_progress, last_count = time.monotonic(), 0
        while any(self.procs[s].poll() is None for s in ("orchestrator", "trainer")):
            time.sleep(2)
            count = len(self.trained())
            if count != last_count:
                last_progress, last_count = time.monotonic(), count
            if time.monotonic() - last_progress > STALL_S:
                raise SystemExit(f"soak {self.name}: no step trained for {STALL_S:g} s (at {count})")
            if restart_at and count >= restart_at[0]:
                restart_at.pop(0)
                self.server.kill()
                self.restarts.append(count)
                time.sleep(3)
                self.start_server()

    def check(self, wall_s: float) -> dict:
        rundir = RunDir(self.run_dir)
        steps = self.trained()
        rows = rundir.metrics.rows(ORCHESTRATOR)
        lag_max = max(r["lag_max"] for r in rows) if rows else None
        logs = sorted(self.root.glob("*.log"))
        tracebacks = {p.name: count_tracebacks(p) for p in logs}
        failed = {
            k: sum(r.get(k, 0) or 0 for r in rows)
            for k in sorted({k for r in rows for k in r})
            if "fail" in k
        }
        proxy_faults = json.loads(self.proxy_counts.read_text()) if self.proxy_counts.exists() else {}
        by_kind = requests_by_kind(proxy_faults, failed)
        return {
            "scenario": self.name,
            "steps": self.steps,
            "exit_codes": {s: p.returncode for s, p in self.procs.items() if s != "proxy"},
            "trained_once": steps == list(range(1, self.steps + 1)),
            "trained_steps": len(steps),
            "lag_max": lag_max,
            "within_eta": lag_max is not None and lag_max <= ETA,
            "batches_checked": self.batch_lags(rundir),
            "tracebacks": tracebacks,
            "inference_restarted_at_step": self.restarts,
            "proxy_faults": proxy_faults,
            "requests_failed_by_kind": by_kind,
            "requests_counted_one_to_one": all(r["injected"] == r["counted"] for r in by_kind),
            "many_calls": many_calls(proxy_faults, rows, self.refused_episodes()),
            "environment_faults": json.loads(self.env_counts.read_text()) if self.env_counts.exists() else {},
            "orchestrator_failure_counts": failed,
            "env_calls": {k: sum(r.get(k, 0) or 0 for r in rows) for k in ENV_CALLS},
            "wall_s": round(wall_s, 1),
            "step_s_median": statistics.median(r["step_time_s"] for r in rows[5:]) if len(rows) > 5 else None,
        }

    def refused_episodes(self) -> int | None:
        """Episodes the orchestrator logged as ended truncated by the template's refusal."""
        refusal = self.spec.get("refusal")
        if refusal is None:
            return None
        lines = (self.root / "orchestrator.log").read_text(errors="replace").splitlines()
        return sum(1 for line in lines if "an episode ended truncated" in line and refusal in line)

    def batch_lags(self, rundir: RunDir) -> dict:
        """The kept batches' oldest sample version against their step (η: step - 1 - version <= η)."""
        worst, checked = 0, 0
        for step in rundir.rollouts.steps():
            path = rundir.batch_file(step)
            if not path.is_file():
                continue
            versions = pq.read_table(path, columns=["policy_version"]).column("policy_version").to_pylist()
            worst, checked = max(worst, step - 1 - min(versions)), checked + 1
        return {"batches": checked, "worst_lag": worst}

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.server is not None:
            self.server.stop()


def count_tracebacks(log: Path) -> int:
    """Tracebacks in a service's log; in inference's, less vLLM's own on a graceful stop
    (tests/helpers.py `server_tracebacks`)."""
    text = log.read_text(errors="replace")
    return len(server_tracebacks(text)) if log.name == "inference.log" else text.count("Traceback")


def requests_by_kind(proxy: dict, failed: dict) -> list[dict]:
    """Per kind of failed request, the proxy's faults that make it (and its calls the upstream did
    not answer, around a restart, or refused itself) against the orchestrator's
    `requests_failed_<kind>`."""
    injected: Counter[str] = Counter()
    for fault, n in proxy.get("injected", {}).items():
        if fault not in ANSWER_FAULTS:  # a good answer rewritten: no failed request
            injected[counted_as(fault)] += n
    injected[COUNTED_AS["upstream_down"]] += proxy.get("upstream_down", 0)
    injected.update(proxy.get("upstream_refused", {}))
    prefix = "requests_failed_"
    kinds = set(injected) | {k.removeprefix(prefix) for k in failed if k.startswith(prefix)}
    return [{"kind": k, "injected": injected[k], "counted": failed.get(prefix + k, 0)} for k in sorted(kinds)]


def many_calls(proxy: dict, rows: list[dict], refused: int | None) -> dict:
    """Turns the proxy made ask for two calls; the renders of such turns by the upstream's answer
    (a one-call template refuses each; two renders a turn, `ChatRenderer.tail`); the episodes that
    ended truncated on that refusal; and all episodes the run ended truncated by a refused render
    (those too, and those a megabyte tool result pushed past the context)."""
    return {
        "two_calls": proxy.get("injected", {}).get("two_calls", 0),
        "renders": proxy.get("many_call_renders", {}),
        "ended_on_refusal": refused,
        "episodes_truncated_render": sum(r.get("episodes_truncated_render", 0) or 0 for r in rows),
    }


def dressed(model: str, family: str, out: Path) -> Path:
    """`model` (its weights linked, not copied) under a vendored family's chat template and special
    tokens (`tests.templates.family_tokenizer`: the Qwen3 tokenizer with them added, in rows the
    model's embedding holds beyond the tokenizer's), so vLLM's parser for the family accepts it:
    `auto` then picks that parser. The model keeps its own end-of-turn token, the one it learned."""
    import copy

    from transformers import AutoTokenizer

    from services.models import resolve_model
    from tests.templates import family_tokenizer, qwen3_tokenizer

    source = Path(resolve_model(model))
    own = AutoTokenizer.from_pretrained(source)
    if own.get_vocab() != qwen3_tokenizer().get_vocab():
        raise SystemExit(f"{model}'s tokenizer is not the Qwen3 tokenizer the family tokenizers are built on")
    tokenizer = copy.deepcopy(family_tokenizer(family))
    tokenizer.eos_token = own.eos_token
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    if len(tokenizer) > vocab:
        raise SystemExit(f"{family}'s special tokens do not fit {model}'s embedding of {vocab} rows")
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():  # its config and weights; the tokenizer and template are written
        linked = path.suffix == ".safetensors" or path.name in ("config.json", "generation_config.json")
        if linked and not (out / path.name).exists():
            (out / path.name).symlink_to(path)
    tokenizer.save_pretrained(out)
    return out


def tomllib_model(config: str) -> str:
    import tomllib

    return tomllib.loads((REPO / config).read_text())["model"]


def markdown(results: list[dict]) -> str:
    lines = ["# Fault soak", ""]
    for r in results:
        ok = r["trained_once"] and r["within_eta"] and not any(r["tracebacks"].values())
        ok = ok and all(code == 0 for code in r["exit_codes"].values())
        lines += [
            f"## {r['scenario']}: {r['trained_steps']} of {r['steps']} steps, "
            f"{'survived' if ok else 'FAILED'} ({r['wall_s']:.0f} s)",
            "",
            f"{r['date']}, `{r['command']}`, {r['share']:.0%} of calls spoiled",
            "",
            f"- exit codes {r['exit_codes']}; trained each step once: {r['trained_once']}; "
            f"lag max {r['lag_max']} (η {ETA}), kept batches {r['batches_checked']}",
            f"- tracebacks in logs: {r['tracebacks']}; inference killed and restarted at steps "
            f"{r['inference_restarted_at_step']}",
            "",
            "| fault injected | where | count |",
            "| --- | --- | --- |",
        ]
        for kind, n in sorted(r["proxy_faults"].get("injected", {}).items()):
            where = (
                "proxy (derender's answer)"
                if kind in ANSWER_FAULTS
                else "proxy (generation, render, derender)"
            )
            lines.append(f"| {kind} | {where} | {n} |")
        for kind, n in sorted(r["environment_faults"].items()):
            lines.append(f"| {kind} | environment | {n} |")
        lines += [
            "",
            f"Failed requests by kind, one to one: {r['requests_counted_one_to_one']} (the proxy's faults, "
            "its calls the restarted upstream did not answer and those vLLM refused itself, against the "
            "orchestrator's `requests_failed_<kind>`)",
            "",
            "| kind | from the proxy | counted by the orchestrator |",
            "| --- | --- | --- |",
        ]
        lines += [f"| {k['kind']} | {k['injected']} | {k['counted']} |" for k in r["requests_failed_by_kind"]]
        calls = r.get("many_calls") or {}
        if calls.get("two_calls"):
            lines += [
                "",
                f"Turns made to ask for two calls: {calls['two_calls']}; renders of such a turn, by vLLM's "
                f"answer: {calls['renders']}; episodes ended truncated on the template's refusal: "
                f"{calls['ended_on_refusal']}, by any refused render: {calls['episodes_truncated_render']}",
            ]
        lines += ["", "| counted by the orchestrator | total |", "| --- | --- |"]
        lines += [f"| {k} | {v} |" for k, v in r["orchestrator_failure_counts"].items()]
        if "env_calls" in r:
            lines += [f"| {k} | {v} |" for k, v in r["env_calls"].items()]
        lines += ["", r["note"], ""] if r.get("note") else [""]
    return "\n".join(lines)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("soak: stopped by SIGTERM"))  # its services too
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    parser.add_argument("--steps", nargs="*", default=[], help="SCENARIO=STEPS")
    parser.add_argument("--share", type=float, default=0.03)
    args = parser.parse_args()
    steps = {k: int(v) for k, v in (s.split("=") for s in args.steps)}
    command = " ".join(["python -m bench.soak", *sys.argv[1:]])
    results = []
    for name in args.only:
        soak = Soak(args.workdir / name, name, steps.get(name, SCENARIOS[name]["steps"]), args.share)
        try:
            outcome = soak.run()
        finally:
            soak.stop()
        results.append({"date": time.strftime("%Y-%m-%d %H:%M"), "command": command, "share": args.share})
        results[-1].update(outcome)
        print(json.dumps(results[-1]), flush=True)
    merged = merge(results, RESULTS / "soak.json")
    (RESULTS / "soak.json").write_text(json.dumps({"results": merged}, indent=1))
    (RESULTS / "soak.md").write_text(markdown(merged))
    print(markdown(results))


def merge(results: list[dict], path: Path) -> list[dict]:
    """These scenarios' results in place of their earlier ones; the other scenarios' kept."""
    kept = json.loads(path.read_text())["results"] if path.exists() else []
    new = {r["scenario"]: r for r in results}
    merged = {r["scenario"]: r for r in kept if r["scenario"] not in new} | new
    return [merged[name] for name in SCENARIOS if name in merged]


if __name__ == "__main__":
    main()
