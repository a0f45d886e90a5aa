"""The embedded default models: a tiny Qwen2 built locally, cached, no model hub.

A byte-level tokenizer (256 byte tokens plus end-of-text) is made with the
`tokenizers` library; the model (0.5M parameters) gets random weights and then a
short supervised warm-up on its built-in task, so that RL starts from a policy
that knows the answer format and earns a reward of about 0.3, not from noise.
`builtin:tiny-addition` is warmed up on single-digit addition,
`builtin:tiny-reverse` on reversing short words.

`builtin:tiny-tools` is a chat model: its tokenizer adds the ChatML tokens
(`<|im_start|>`, `<|im_end|>`, which ends a turn) and the non-special tokens
`<tool_call>`, `</tool_call>`, `<think>`, `</think>` (kept when decoding with
skip_special_tokens), and carries `CHAT_TEMPLATE`. It is warmed up on ideal
conversations of the chat calculator (a tool call, its result, the answer)
rendered with that template, on the assistant's tokens only.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("triad.model")

EOS = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHAT_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>")  # not special: decoded as text
BUILD_VERSION = 2
CHAT_VERSION = 2  # the chat recipes' own build version (tokenizer, template, warm-up)
SHAPE = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# The chat model's changes to SHAPE: room for a conversation with a tool call, and four heads of 32
# (with two of 64, no warm-up tried, up to 1000 steps, learnt to copy the question into the call).
CHAT_SHAPE = dict(max_position_embeddings=512, num_attention_heads=4, num_key_value_heads=4)

# ChatML. With tools, a first system block lists them compactly (merged with a system message);
# assistant tool calls follow the content as Hermes/Qwen <tool_call> blocks, their arguments an
# object written with tojson (vLLM parses OpenAI's JSON-string arguments into one first; a string
# that reaches the template is written as it is, the same text for json.dumps's output);
# `drop_think` removes <think>...</think> from assistant messages before the last user message;
# `enable_thinking = false` opens each assistant turn with an empty think block, as Qwen3's template
# does (and, as there, a rendered assistant message does not have it: re-rendering rewrites history).
# What a message renders to never depends on later messages, so a conversation's tokens extend
# its earlier renderings.
CHAT_TEMPLATE = """\
{%- set ns = namespace(last_user=-1, merged=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if messages and messages[0].role == 'system' -%}
    {{- messages[0].content ~ '\\n' -}}{%- set ns.merged = 0 -%}
  {%- endif -%}
  {{- 'tools: ' -}}
  {%- for t in tools -%}
    {%- set f = t.function if t.function is defined else t -%}
    {%- set p = f.parameters if f.parameters is defined else {} -%}
    {%- set params = p.properties if p.properties is defined else {} -%}
    {{- (', ' if not loop.first else '') ~ f.name ~ '(' ~ (params | list | join(', ')) ~ ')' -}}
  {%- endfor -%}
  {{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- set content = m.content if m.content is string else '' -%}
  {%- if loop.index0 == ns.merged -%}
  {%- elif m.role == 'assistant' -%}
    {%- set old = loop.index0 < ns.last_user -%}
    {%- if drop_think is defined and drop_think and old and '</think>' in content -%}
      {%- set head = content.split('<think>')[0] if '<think>' in content else '' -%}
      {%- set content = head ~ content.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\\n' ~ content -}}
    {%- for call in (m.tool_calls or []) -%}
      {%- set f = call.function if call.function is defined else call -%}
      {%- set args = f.arguments if f.arguments is string else (f.arguments | tojson) -%}
      {{- ('\\n' if content or not loop.first else '') ~ '<tool_call>\\n{"name": ' ~ (f.name | tojson) -}}
      {{- ', "arguments": ' ~ args ~ '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' ~ m.role ~ '\\n' ~ content ~ '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and not enable_thinking -%}
    {{- '<think>\\n\\n</think>\\n\\n' -}}
  {%- endif -%}
{%- endif -%}
"""


def calculate_schema() -> dict:
    """The calculator tool's OpenAI schema, as the orchestrator renders it (the warm-up's tools)."""
    from orchestrator.envs.calculator import calculate
    from orchestrator.tools import tool_schema

    return tool_schema(calculate)


def cache_root() -> Path:
    return Path(os.environ.get("TRIAD_CACHE", Path.home() / ".cache" / "triad"))


def make_tokenizer(chat: bool = False):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    if not chat:
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    tok.add_special_tokens([IM_START, IM_END])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CHAT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=IM_END,
        additional_special_tokens=[EOS, IM_START],
        chat_template=CHAT_TEMPLATE,
    )


def make_model(tokenizer, seed: int, untied: bool = False, **shape):
    """Qwen2 with the output layer tied to the embedding, or (`untied`) Llama with its own
    `lm_head`, which vLLM's Llama can adapt by LoRA (its Qwen2 adapts only the inner linears)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if untied else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(
        vocab_size=len(tokenizer),
        tie_word_embeddings=not untied,
        bos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
        **{**SHAPE, **shape},
    )
    return model_class(config)


@dataclass(frozen=True)
class Recipe:
    task: str
    warmup_steps: int
    warmup_lr: float
    chat: bool = False  # a chat model: ChatML tokenizer and template, warmed up on conversations
    untied: bool = False  # Llama with its own lm_head (see make_model)


# Warm-ups measured to start RL near a reward of 0.3 (sampled at temperature 1).
RECIPES = {
    "tiny-addition": Recipe(task="addition", warmup_steps=137, warmup_lr=3e-4),
    # for LoRA: sampled at temperature 1 it is right 0.36 of the time and greedily 0.96; the gap is
    # the logits' scale, which LoRA on lm_head can change (150 supervised steps: 0.36 -> 1.0; on
    # the seven inner linears alone: 0.36 -> 0.46; docs/design.md, "What LoRA can learn")
    "tiny-addition-untied": Recipe(task="addition", warmup_steps=137, warmup_lr=3e-4, untied=True),
    "tiny-reverse": Recipe(task="reverse", warmup_steps=160, warmup_lr=3e-4),
    # copying the question into the tool call and the result into the answer is learnt suddenly:
    # reward 0.03 after 420 steps, 0.26 after 440, 0.29 after 450, 0.40 after 470, 0.55 after 540
    "tiny-tools": Recipe(task="calculator", warmup_steps=450, warmup_lr=1e-3, chat=True),
}


def supervised(model, make_batch, steps: int, lr: float, pad: int) -> float:
    """`steps` AdamW steps on batches of (token rows, loss masks); returns the last loss."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        rows, masks = make_batch()
        width = max(map(len, rows))
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        labels = ids.masked_fill(~mask, -100)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()


def warm_up(model, tokenizer, task_name: str, steps: int, lr: float, seed: int, batch: int = 64) -> float:
    """Teach the answer format by supervised steps on the task; returns the last loss."""
    from orchestrator.envs import BUILTIN

    task, rng = BUILTIN[task_name](), random.Random(seed)

    def make_batch():
        rows, masks = [], []
        for _ in range(batch):
            p = task.sample(rng)
            prompt = tokenizer.encode(p.text)
            answer = tokenizer.encode(p.answer) + [tokenizer.eos_token_id]
            rows.append(prompt + answer)
            masks.append([0] * len(prompt) + [1] * len(answer))
        return rows, masks

    return supervised(model, make_batch, steps, lr, tokenizer.eos_token_id)


def assistant_mask(tokenizer, ids: list[int]) -> list[int]:
    """1 on the assistant's tokens of a rendered conversation: each assistant turn after its
    `<|im_start|>assistant\\n` up to and including its `<|im_end|>`; 0 elsewhere."""
    head = tokenizer.encode(IM_START + "assistant\n", add_special_tokens=False)
    end, mask, inside, i = tokenizer.convert_tokens_to_ids(IM_END), [0] * len(ids), False, 0
    while i < len(ids):
        if ids[i : i + len(head)] == head:
            inside, i = True, i + len(head)
            continue
        mask[i] = int(inside)
        inside = inside and ids[i] != end
        i += 1
    return mask


def warm_up_chat(model, tokenizer, task_name: str, steps: int, lr: float, seed: int, batch: int = 16):
    """Supervised steps on the task's ideal conversations (`demonstration`), rendered with the
    tokenizer's chat template and its tools, on the assistant's tokens; returns the last loss."""
    from orchestrator.envs import BUILTIN

    task, rng = BUILTIN[task_name](), random.Random(seed)

    def make_batch():
        rows, masks = [], []
        for _ in range(batch):
            p = task.sample(rng)
            text = tokenizer.apply_chat_template(
                p.messages + task.demonstration(p), tools=[calculate_schema()], tokenize=False
            )
            ids = tokenizer.encode(text, add_special_tokens=False)
            rows.append(ids)
            masks.append(assistant_mask(tokenizer, ids))
        return rows, masks

    return supervised(model, make_batch, steps, lr, tokenizer.pad_token_id)


def build_tiny_model(dest: Path, recipe: Recipe, seed: int = 0) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # `triad up` output stays free of control characters
    tokenizer = make_tokenizer(chat=recipe.chat)
    model = make_model(tokenizer, seed, recipe.untied, **(CHAT_SHAPE if recipe.chat else {}))
    if recipe.warmup_steps:
        train = warm_up_chat if recipe.chat else warm_up
        loss = train(model, tokenizer, recipe.task, recipe.warmup_steps, recipe.warmup_lr, seed)
        log.info("warm-up on %s: %d steps, final loss %.3f", recipe.task, recipe.warmup_steps, loss)
    model.save_pretrained(dest, safe_serialization=True)
    # chat_template in tokenizer_config.json rather than a chat_template.jinja beside it
    tokenizer.save_pretrained(dest, **({"save_jinja_files": False} if recipe.chat else {}))


def cache_name(name: str, recipe: Recipe) -> str:
    version = f"{BUILD_VERSION}c{CHAT_VERSION}" if recipe.chat else f"{BUILD_VERSION}"
    return f"{name}-v{version}-w{recipe.warmup_steps}"


def ensure_tiny_model(name: str) -> Path:
    """Build the named tiny model once (under a lock) and return its directory."""
    recipe = RECIPES[name]
    root = cache_root() / "models"
    root.mkdir(parents=True, exist_ok=True)
    dest = root / cache_name(name, recipe)
    with open(root / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / "config.json").exists():
            return dest
        log.info("building the embedded tiny model in %s (once)", dest)
        tmp = root / f".tmp-{dest.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_tiny_model(tmp, recipe)
        os.replace(tmp, dest)
    return dest
