"""The embedded chat model: a tiny Qwen3 on the real Qwen3 tokenizer and chat template.

The tokenizer files (and the template in them) are Qwen/Qwen3-0.6B's, vendored in
`shared/data/qwen3_tokenizer/`; the model is a Qwen3ForCausalLM with a small hidden
size and its output layer tied to the embedding (the 151,936-row vocabulary is most of
its weights). It is warmed up on episodes of its task as the orchestrator builds them:
the prompt rendered with the generation prompt, each assistant turn
as the template writes it and its `<|im_end|>`, then what the template renders after
it (the tool results and the next generation prompt), trained on the assistant's tokens.

The warm-up has two phases. First `copy_steps` on episodes that all call the tool,
rendered without the template's tool instructions (about 150 tokens of system prompt):
in those short episodes the model learns to copy digits (the expression into the
call, the result into the answer). Over the whole prompt it does not learn it at all:
with the system prompt from the start, 800 steps left each copied digit at about 2.3
nats (a guess among ten), and once learnt short the copy carries over to the long
episodes within 100 steps. Then `warmup_steps` on the episodes as served: a share
`tool_share` call the tool and copy its result into the answer, the rest answer at
once, which the model cannot compute, so RL starts near `tool_share` and can learn
to call the tool. A share `thinking_share` are rendered with thinking on: the model
writes the empty think block itself, so it serves Qwen3's template both ways (the
sampled check and `configs/tiny-tools.toml` use thinking off).

The warm-up runs with fixed seeds, a fixed thread count and deterministic algorithms,
and only the assistant's positions go through the output layer. The build then samples
the model at temperature 1 on held-out prompts, runs the episodes as the orchestrator
does, and refuses to cache a model whose mean reward is below the recipe's target.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.progress import StepProgress
from shared.errors import TriadError

TOKENIZER_DIR = Path(__file__).parents[1] / "shared" / "data" / "qwen3_tokenizer"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
ASSISTANT_HEAD = IM_START + "assistant\n"
THINK_END = "</think>"
EMPTY_THINK = "<think>\n\n</think>\n\n"  # what opens a turn with thinking off (the template writes it)
THREADS = 2  # the warm-up's thread count on every machine (results depend on it)
VOCAB_SIZE = 151936  # Qwen3's embedding rows (the tokenizer's 151,669 ids, padded)
SHAPE = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=1024,
)
BUILD_TIME = "about 3 minutes on 2 idle cores"  # tiny-tools: 3:22 (bench/results/first_ten_minutes.md)
BUILD_FILE = "triad_build.json"  # beside config.json: the recipe, the reached reward, the weights digest


@dataclass(frozen=True)
class ChatRecipe:
    task: str
    copy_steps: int  # first, on short episodes that all call the tool (no tool instructions)
    warmup_steps: int  # then on the episodes as served
    warmup_lr: float
    tool_share: float  # of the second phase's episodes that call the tool (the rest answer at once)
    target: float  # the least mean reward the sampled check must reach
    thinking_share: float = 0.0  # of the second phase's episodes with thinking on
    batch: int = 16
    check_prompts: int = 64
    max_tokens: int = 80  # per model turn, as the config samples


def load_tokenizer():
    from transformers import AutoTokenizer

    if not (TOKENIZER_DIR / "tokenizer_config.json").is_file():
        raise TriadError(f"the Qwen3 tokenizer files are missing from {TOKENIZER_DIR}: restore them from git")
    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def render(
    tokenizer, messages: list[dict], tools: list[dict], generation_prompt: bool, thinking: bool = False
) -> str:
    return tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=generation_prompt,
        enable_thinking=thinking,
    )


def assistant_text(tokenizer, message: dict, tools: list[dict], thinking: bool = False) -> str:
    """The text the model is to sample for one assistant message: what the template writes for it
    between its header (and empty think block) and its `<|im_end|>`; with thinking on, the model
    writes the empty think block itself."""
    text = render(tokenizer, [{"role": "user", "content": "."}, message], tools, False)
    body = text[text.rindex(ASSISTANT_HEAD) + len(ASSISTANT_HEAD) : text.rindex(IM_END)]
    body = body.split(THINK_END, 1)[1].lstrip("\n") if THINK_END in body else body
    return EMPTY_THINK + body if thinking else body


def after_turn_text(
    tokenizer, before: list[dict], turn: str, new: list[dict], tools: list[dict], thinking: bool = False
) -> str:
    """What follows a sampled turn's `<|im_end|>`: the rest of its closing, `new` and the next
    generation prompt, as found in the longer rendering (where an earlier turn's empty think
    block is not written: from the `<|im_end|>` after the turn's answer)."""
    text = render(tokenizer, [*before, {"role": "assistant", "content": turn}, *new], tools, True, thinking)
    answer = turn.split(THINK_END)[-1].lstrip("\n")
    return text[text.index(IM_END, text.rindex(answer)) + len(IM_END) :]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def episode_ids(
    tokenizer, messages: list[dict], tools: list[dict], thinking: bool = False
) -> tuple[list[int], list[int]]:
    """A whole episode's ids as the orchestrator builds them, and 1 on the assistant's."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = encode(tokenizer, render(tokenizer, messages[:first], tools, True, thinking))
    mask = [0] * len(ids)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for n, at in enumerate(turns):
        text = assistant_text(tokenizer, messages[at], tools, thinking)
        turn = encode(tokenizer, text) + [tokenizer.convert_tokens_to_ids(IM_END)]
        ids, mask = ids + turn, mask + [1] * len(turn)
        end = turns[n + 1] if n + 1 < len(turns) else len(messages)
        if end > at + 1:
            after = encode(
                tokenizer,
                after_turn_text(tokenizer, messages[:at], text, messages[at + 1 : end], tools, thinking),
            )
            ids, mask = ids + after, mask + [0] * len(after)
    return ids, mask


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """Seeded, THREADS threads and deterministic algorithms; the caller's settings are restored."""
    import torch

    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(strict)


def make_chat_model(tokenizer, seed: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
        **SHAPE,
    )
    return Qwen3ForCausalLM(config)


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def task_tools(task) -> list[dict]:
    from orchestrator.episodes.tools import tool_schema

    return [tool_schema(fn) for fn in getattr(task, "tools", ())]


@dataclass(frozen=True)
class Phase:
    """What a warm-up phase's episodes are: rendered with `tools` in the system prompt (none: no
    tool instructions), a share `tool_share` calling the tool, a share `thinking_share` with
    thinking on."""

    tools: list[dict]
    tool_share: float
    thinking_share: float = 0.0


def warm_up_batch(tokenizer, task, batch: int, phase: Phase, rng: random.Random) -> tuple[list, list]:
    rows, masks = [], []
    for _ in range(batch):
        p = task.sample(rng)
        uses_tool, thinking = rng.random() < phase.tool_share, rng.random() < phase.thinking_share
        answer = task.demonstration(p) if uses_tool else [{"role": "assistant", "content": p.answer}]
        ids, mask = episode_ids(tokenizer, p.messages + answer, phase.tools, thinking)
        rows.append(ids)
        masks.append(mask)
    return rows, masks


def task_vocabulary(tokenizer, task, recipe: ChatRecipe, seed: int) -> list[int]:
    """The ids the task's episodes are made of (every digit included), from 256 of each form,
    with and without the tool instructions."""
    rng, tools = random.Random(f"vocabulary {seed}"), task_tools(task)
    ids = set(encode(tokenizer, "0123456789")) | {tokenizer.pad_token_id}
    for _ in range(256):
        p = task.sample(rng)
        for answer in (task.demonstration(p), [{"role": "assistant", "content": p.answer}]):
            for shown, thinking in (([], False), (tools, False), (tools, True)):
                ids |= set(episode_ids(tokenizer, p.messages + answer, shown, thinking)[0])
    return sorted(ids)


class TaskModel:
    """The model restricted to the task's ids `keep` for the warm-up: the same layers with an
    embedding of those rows only, the other rows of the whole model held at zero. Their logits
    are then 0, so the softmax over the whole vocabulary is exact from the kept rows and one
    logit log(count of the others); only a few hundred rows go through the output layer and
    the optimizer instead of 151,936. `fill` writes the result back into the whole model."""

    def __init__(self, model, keep: list[int]) -> None:
        import copy

        import torch

        self.keep = torch.tensor(keep)
        self.index = torch.full((model.config.vocab_size,), -1, dtype=torch.long)
        self.index[self.keep] = torch.arange(len(keep))
        self.others = math.log(model.config.vocab_size - len(keep))
        config = copy.deepcopy(model.config)
        config.vocab_size, config.pad_token_id = len(keep), int(self.index[config.pad_token_id])
        self.model = type(model)(config)
        state = model.state_dict()
        rows = {k for k, v in state.items() if v.shape[:1] == (model.config.vocab_size,)}
        self.model.load_state_dict({k: v[self.keep] if k in rows else v for k, v in state.items()})

    def local(self, ids: list[int]) -> list[int]:
        local = self.index[ids].tolist()
        if -1 in local:
            raise TriadError(f"the warm-up met ids outside the task's vocabulary: {ids[local.index(-1)]}")
        return local

    def loss(self, rows: list[list[int]], masks: list[list[int]]):
        """Cross-entropy on the masked (assistant) tokens, over the whole vocabulary."""
        import torch

        width = max(map(len, rows))
        ids = torch.tensor([self.local(r) + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        hidden = self.model.model(input_ids=ids).last_hidden_state  # right padding: real tokens never see it
        predicts = mask[:, 1:]
        logits = self.model.lm_head(hidden[:, :-1][predicts])
        logits = torch.cat([logits, torch.full((len(logits), 1), self.others)], dim=1)
        return torch.nn.functional.cross_entropy(logits, ids[:, 1:][predicts])

    def fill(self, model) -> None:
        import torch

        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                trained = self.model.state_dict()[name]
                if trained.shape == tensor.shape:
                    tensor.copy_(trained)
                else:
                    tensor.zero_()
                    tensor[self.keep] = trained


def warm_up_chat(
    model, tokenizer, recipe: ChatRecipe, seed: int, progress: StepProgress | None = None
) -> float:
    """`recipe.copy_steps` then `recipe.warmup_steps` AdamW steps (one optimizer) on the task's
    episodes, each reported to `progress`; returns the last loss."""
    import torch

    from orchestrator.envs import BUILTIN

    task, rng = BUILTIN[recipe.task](), random.Random(seed)
    small = TaskModel(model, task_vocabulary(tokenizer, task, recipe, seed))
    opt = torch.optim.AdamW(small.model.parameters(), lr=recipe.warmup_lr)
    small.model.train()
    loss = torch.tensor(0.0)
    served = Phase(task_tools(task), recipe.tool_share, recipe.thinking_share)
    phases = [Phase([], 1.0)] * recipe.copy_steps + [served] * recipe.warmup_steps
    for i, phase in enumerate(phases):
        if progress is not None:
            progress.step(
                i, len(phases), "warm-up, short tool episodes" if i < recipe.copy_steps else "warm-up"
            )
        loss = small.loss(*warm_up_batch(tokenizer, task, recipe.batch, phase, rng))
        opt.zero_grad()
        loss.backward()
        opt.step()
    small.fill(model)
    model.eval()
    return loss.item()


def sample_turns(model, contexts: list[list[int]], max_tokens: int, end: int, pad: int) -> list[list[int]]:
    """One sampled turn per context at temperature 1 (no top-k, no top-p), each up to and
    including its `end` token or `max_tokens` long."""
    import torch

    width = max(map(len, contexts))
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    out = model.generate(
        input_ids=ids,
        attention_mask=attention,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_tokens,
        eos_token_id=end,
        pad_token_id=pad,
    )
    turns = []
    for row in out[:, width:].tolist():
        turns.append(row[: row.index(end) + 1] if end in row else row)
    return turns


@dataclass
class Episode:
    prompt: object
    messages: list[dict]
    ids: list[int]
    conversation: list[dict]
    done: bool = False


def play_turn(tokenizer, episode: Episode, turn: list[int], runner, tools: list[dict]) -> None:
    """The orchestrator's handling of one sampled turn: parse its tool calls, run them, append
    their results and the next generation prompt (or end the episode)."""
    import asyncio

    from orchestrator.episodes.tool_calls import assistant_message, parse_tool_calls

    end = tokenizer.convert_tokens_to_ids(IM_END)
    text = tokenizer.decode(turn[:-1] if turn[-1:] == [end] else turn, skip_special_tokens=True)
    parsed = parse_tool_calls(text)
    before = episode.messages + episode.conversation
    episode.conversation.append(assistant_message(parsed))
    episode.ids += turn
    if turn[-1:] != [end] or not (parsed.calls or parsed.errors):
        episode.done = True
        return
    results = asyncio.run(runner.run_turn(parsed))
    episode.conversation += results
    episode.ids += encode(tokenizer, after_turn_text(tokenizer, before, text, results, tools))


def sampled_reward(model, tokenizer, recipe: ChatRecipe, seed: int) -> tuple[float, float]:
    """The mean reward of one episode on each of `recipe.check_prompts` held-out prompts, sampled
    at temperature 1 with the real template, thinking off; and the share of episodes that called a tool."""
    import torch

    from orchestrator.envs import BUILTIN
    from orchestrator.episodes.tools import ToolRunner

    task, rng = BUILTIN[recipe.task](), random.Random(f"held-out {seed}")
    tools, runner = task_tools(task), ToolRunner(list(getattr(task, "tools", ())), timeout=10.0)
    episodes = []
    for _ in range(recipe.check_prompts):
        p = task.sample(rng)
        episodes.append(
            Episode(p, p.messages, encode(tokenizer, render(tokenizer, p.messages, tools, True)), [])
        )
    end, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.pad_token_id
    with torch.no_grad():
        for _ in range(getattr(task, "max_turns", 1)):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            turns = sample_turns(model, [e.ids for e in live], recipe.max_tokens, end, pad)
            for e, turn in zip(live, turns, strict=True):
                play_turn(tokenizer, e, turn, runner, tools)
    rewards = [task.reward(e.prompt, e.conversation) for e in episodes]
    called = [any(m["role"] == "tool" for m in e.conversation) for e in episodes]
    return sum(rewards) / len(rewards), sum(called) / len(called)


def build_chat_model(dest: Path, name: str, recipe: ChatRecipe, seed: int = 0) -> dict:
    """Build, warm up and check the chat model into `dest`; TriadError (one line) if the sampled
    reward is below the recipe's target. Returns what it wrote to BUILD_FILE."""
    import time

    start = time.monotonic()
    progress = StepProgress(f"building builtin:{name} (once; {BUILD_TIME})")
    with progress.during("loading torch, transformers and the tokenizer"):
        import torch  # noqa: F401  (the slow imports, here where the wait is reported)
        import transformers.models.qwen3.modeling_qwen3  # noqa: F401

        tokenizer = load_tokenizer()
    with deterministic(seed):
        model = make_chat_model(tokenizer, seed)
        loss = warm_up_chat(model, tokenizer, recipe, seed, progress)
        with progress.during(f"checking it by sampling {recipe.check_prompts} held-out episodes"):
            reward, tool_rate = sampled_reward(model, tokenizer, recipe, seed)
    progress.done()
    build = {
        "model": f"builtin:{name}",
        "task": recipe.task,
        "copy_steps": recipe.copy_steps,
        "warmup_steps": recipe.warmup_steps,
        "final_loss": round(loss, 4),
        "sampled_reward": reward,
        "tool_call_rate": tool_rate,
        "target": recipe.target,
        "check_prompts": recipe.check_prompts,
        "threads": THREADS,
        "weights_sha256": weights_digest(model),
        "build_s": round(time.monotonic() - start, 1),
    }
    if reward < recipe.target:
        raise TriadError(
            f"builtin:{name}: the warm-up reached a sampled reward of {reward:.2f} (tool calls in "
            f"{tool_rate:.0%} of episodes), below its target {recipe.target:.2f}; nothing was cached: "
            f"report it with this line, or raise the recipe's warmup_steps in services/tiny_model.py"
        )
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    (dest / BUILD_FILE).write_text(json.dumps(build, indent=1) + "\n")
    return build
