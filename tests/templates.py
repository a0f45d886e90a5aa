"""Vendored chat templates of real model families (shared/data/templates), as tokenizers tests render with.

A family's own tokenizer is too big to vendor for most families, so `family_tokenizer` builds one from the
real Qwen3 BPE (shared/data/qwen3_tokenizer) with the family's special tokens added as special tokens and
the family's own chat template set: the template and the special tokens are real, the BPE of ordinary text
is Qwen3's.
"""

from __future__ import annotations

import copy
import functools
import tomllib
from pathlib import Path
from typing import Any

from transformers import AddedToken, AutoTokenizer, PreTrainedTokenizerFast

DATA = Path(__file__).resolve().parent.parent / "shared" / "data"
TEMPLATES = DATA / "templates"
QWEN3_TOKENIZER = DATA / "qwen3_tokenizer"

FAMILIES: dict[str, dict[str, Any]] = tomllib.loads((TEMPLATES / "families.toml").read_text())


def family(name: str) -> dict[str, Any]:
    """The families.toml table of `name`, with one line naming the known families when there is none."""
    if name not in FAMILIES:
        raise KeyError(
            f"no template family {name!r} in {TEMPLATES / 'families.toml'}; known: {sorted(FAMILIES)}"
        )
    return FAMILIES[name]


def chat_template(name: str) -> str:
    return (TEMPLATES / family(name)["template"]).read_text()


@functools.cache
def qwen3_tokenizer() -> PreTrainedTokenizerFast:
    """The real Qwen3 tokenizer with its own chat template."""
    return AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)


@functools.cache
def family_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """A tokenizer writing `name`'s chat template, its special tokens as single tokens (see module doc)."""
    spec = family(name)
    tokenizer = copy.deepcopy(qwen3_tokenizer())
    added = tokenizer.get_added_vocab()
    missing = [t for t in spec["special_tokens"] if t not in added]
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True
    )
    if spec["bos"] in spec["special_tokens"]:
        tokenizer.bos_token = spec["bos"]
    tokenizer.eos_token = spec["eos"][0]
    tokenizer.chat_template = chat_template(name)
    return tokenizer


def render(
    name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kwargs: Any
) -> str:
    """`messages` as the family's own template writes them (chat_template_kwargs go in `kwargs`)."""
    return family_tokenizer(name).apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


def sampled_turn(
    name: str,
    messages: list[dict[str, Any]],
    assistant: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> list[int]:
    """The ids a model would have sampled for `assistant` after `messages`, as the template writes them.

    They are the ids of the full rendering after its common prefix with the generation prompt, up to (not
    including) the first end-of-turn token. Where the generation prompt opens a reasoning block that the
    rendered history leaves out (DeepSeek-R1), the model's closing think token comes first.
    """
    spec = family(name)
    tokenizer = family_tokenizer(name)
    prompt = tokenizer.encode(
        render(name, messages, tools, add_generation_prompt=True, **kwargs), add_special_tokens=False
    )
    full = tokenizer.encode(render(name, [*messages, assistant], tools, **kwargs), add_special_tokens=False)
    common = next(
        (i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), min(len(prompt), len(full))
    )
    turn = full[common:]
    ends = {tokenizer.convert_tokens_to_ids(t) for t in spec["eos"]}
    turn = next((turn[:i] for i, t in enumerate(turn) if t in ends), turn)
    if common < len(prompt) and spec["think_in_prompt"]:
        turn = tokenizer.encode(spec["think_tokens"][1] + "\n\n", add_special_tokens=False) + turn
    return turn
