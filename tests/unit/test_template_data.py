"""The vendored templates, the Qwen3 tokenizer and the per-family tokenizers built from them."""

from __future__ import annotations

import hashlib
import re

import pytest

from inference.families import family_of, parsers_for
from tests.templates import FAMILIES, TEMPLATES, chat_template, family_tokenizer, qwen3_tokenizer, render


def test_every_vendored_template_has_the_bytes_sources_md_records() -> None:
    lines = re.findall(r"^([0-9a-f]{64})  (\S+\.jinja)$", _sources(), re.M)
    recorded = {name: digest for digest, name in lines}
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in TEMPLATES.glob("*.jinja")}

    assert recorded == on_disk
    assert sorted(s["template"] for s in FAMILIES.values()) == sorted(on_disk)


def _sources() -> str:
    return (TEMPLATES / "SOURCES.md").read_text()


def test_qwen3_tokenizer_encodes_as_the_published_one() -> None:
    tokenizer = qwen3_tokenizer()

    assert len(tokenizer) == 151669
    assert tokenizer.encode("Hello world") == [9707, 1879]
    assert tokenizer.convert_tokens_to_ids(
        ["<|im_start|>", "<|im_end|>", "<tool_call>", "<think>", "</think>"]
    ) == [
        151644,
        151645,
        151657,
        151667,
        151668,
    ]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_tokenizer_keeps_each_special_token_whole(name: str) -> None:
    spec = FAMILIES[name]
    tokenizer = family_tokenizer(name)

    for token in spec["special_tokens"]:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert tokenizer.eos_token == spec["eos"][0]
    prompt = render(name, [{"role": "user", "content": "Hi there"}], add_generation_prompt=True)
    assert "Hi there" in prompt
    assert spec["bos"] == "" or prompt.startswith(spec["bos"])


READ_BACK_ONLY = "seed_oss"  # no family of the table: tests/unit/test_parser_probe.py reads its parsers back


def test_the_table_alone_does_not_serve_seed_oss() -> None:
    template = chat_template(READ_BACK_ONLY)
    assert family_of(template) is None and parsers_for(template, "auto", "auto") == (None, None)


@pytest.mark.parametrize("name", sorted(set(FAMILIES) - {READ_BACK_ONLY}))
def test_auto_parsers_are_the_ones_that_fit_each_family(name):
    """`inference.tool_parser = "auto"` (and reasoning_parser) pick, from the template alone, the parsers
    families.toml records as fitting (none where vLLM has none)."""
    spec = FAMILIES[name]
    expected = (spec["tool_parser"] or None, spec["reasoning_parser"] or None)
    assert parsers_for(chat_template(name), "auto", "auto") == expected
    assert parsers_for(chat_template(name), "none", "none") == (None, None)
    assert parsers_for(chat_template(name), "pythonic", "auto")[0] == "pythonic"
