"""`auto` parsers by reading back the template's own rendering (inference/parser_probe.py).

The Seed-OSS template (shared/data/templates/seed_oss.jinja) belongs to no family of inference/families.py:
its parsers come from the read-back alone. The tokenizers are tests/templates.py's (real template and
special tokens, Qwen3's BPE), saved as model directories where `auto_parsers` needs one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference import parser_probe
from inference.families import chat_template_of, family_of
from inference.parser_probe import ParserCache, auto_parsers, choose_parsers, probe_turn
from shared.errors import TriadError
from tests.templates import chat_template, family_tokenizer

pytest.importorskip("vllm")

# writes the call in a format of its own: `CALL name {json}`; and no reasoning
OWN_FORMAT = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}"
    "{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_TOOLS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def model_dir(tmp_path: Path, name: str, template: str | None = None, model_type: str = "seed_oss") -> Path:
    tokenizer = family_tokenizer(name)
    saved_template = tokenizer.chat_template
    try:
        tokenizer.chat_template = template or saved_template
        tokenizer.save_pretrained(tmp_path)
    finally:
        tokenizer.chat_template = saved_template
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return tmp_path


def test_seed_oss_is_no_family_of_the_table() -> None:
    assert family_of(chat_template("seed_oss")) is None


def test_the_probe_turn_is_what_the_template_writes_for_the_model_to_sample() -> None:
    turn = probe_turn(family_tokenizer("seed_oss"))

    assert turn is not None and turn.writes_call and turn.writes_reasoning
    assert turn.text == (
        "<seed:think>The user asks what a tea pot is, so I look the word up.</seed:think>\n"
        "<seed:tool_call>\n<function=lookup_word>\n<parameter=word>tea pot</parameter>\n"
        "<parameter=limit>3</parameter>\n</function>\n</seed:tool_call>"
    )


def test_auto_reads_seed_oss_parsers_back_from_its_own_template(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRIAD_CACHE", str(tmp_path / "cache"))
    model = model_dir(tmp_path / "model", "seed_oss")

    assert auto_parsers(str(model), chat_template_of(model), "auto", "auto") == ("seed_oss", "seed_oss")
    assert auto_parsers(str(model), chat_template_of(model), "hermes", "none") == ("hermes", None)


def test_the_choice_is_kept_per_template(tmp_path: Path, monkeypatch) -> None:
    cache = ParserCache(tmp_path)
    tokenizer = family_tokenizer("seed_oss")
    template = chat_template("seed_oss")
    first = cache.choice(tokenizer, template, "auto", "auto", ["seed_oss"])

    def no_probe(*_args, **_kwargs):
        raise AssertionError("probed again")

    monkeypatch.setattr(parser_probe, "choose_parsers", no_probe)
    assert (
        cache.choice(tokenizer, template, "auto", "auto", ["seed_oss"]) == first == ("seed_oss", "seed_oss")
    )
    assert len(list(tmp_path.glob("*.json"))) == 1
    with pytest.raises(AssertionError, match="probed again"):
        cache.choice(tokenizer, template + " ", "auto", "auto", ["seed_oss"])


def test_a_configured_reasoning_parser_is_kept_and_the_tool_parser_read_back() -> None:
    tokenizer = family_tokenizer("seed_oss")

    assert choose_parsers(tokenizer, "auto", "seed_oss", hints=["seed_oss"]) == ("seed_oss", "seed_oss")


def test_a_template_writing_no_tool_call_needs_no_parser(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRIAD_CACHE", str(tmp_path / "cache"))
    model = model_dir(tmp_path / "model", "qwen2_5", NO_TOOLS, model_type="plain")

    assert auto_parsers(str(model), chat_template_of(model), "auto", "auto") == (None, None)


def test_a_tool_call_no_parser_reads_back_is_refused_in_one_line() -> None:
    tokenizer = family_tokenizer("qwen2_5")
    tokenizer.chat_template = OWN_FORMAT
    try:
        with pytest.raises(TriadError) as refused:
            choose_parsers(tokenizer, "auto", "auto")
    finally:
        tokenizer.chat_template = chat_template("qwen2_5")

    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("inference.tool_parser = 'auto': no vLLM parser reads back the tool call")
    assert "hermes, " in message and "seed_oss" in message and "'none'" in message


def test_a_family_of_the_table_is_not_probed(monkeypatch) -> None:
    monkeypatch.setattr(parser_probe, "choose_parsers", lambda *a, **k: pytest.fail("probed"))

    assert auto_parsers("/nowhere", chat_template("qwen3"), "auto", "auto") == ("hermes", "qwen3")
