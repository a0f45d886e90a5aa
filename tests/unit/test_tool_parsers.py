"""vLLM's tool-call and reasoning parsers read what each family's own chat template writes.

Each case renders an assistant turn through a vendored template (shared/data/templates), cuts out the ids the
model would have sampled (tests/templates.py: sampled_turn), decodes them with special tokens kept (as vLLM's
derender does) and parses them with the unified parser vLLM's serving layer composes for the family's
--tool-call-parser and --reasoning-parser (ParserManager.get_parser). Parsed names, arguments, reasoning and
content are compared as values with what was rendered.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
import pytest

from tests.templates import DATA, FAMILIES, family, family_tokenizer, render, sampled_turn

pytest.importorskip("vllm")

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up in the dictionary.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word"],
            },
        },
    },
]
CALLS = [("add", {"a": 2, "b": 3}), ("lookup", {"word": "tea pot"})]
QUESTION = [{"role": "user", "content": "What is 2+3, and what is a tea pot?"}]
REASONING = "Two plus three is five."
ANSWER = "The answer is 5."

TOOL_FAMILIES = [f for f, s in FAMILIES.items() if s["tool_parser"] and s["renders_tool_calls"]]
KNOWN_WRONG = {
    "mistral_small_3_2": (
        "vLLM's mistral parser on a Hugging Face tokenizer keeps the template's [CALL_ID] in the tool name"
    ),
}


def _cases() -> list[Any]:
    cases = []
    for name in TOOL_FAMILIES:
        limit = family(name)["max_calls_per_turn"] or len(CALLS)
        for n in range(1, min(limit, len(CALLS)) + 1):
            marks = [pytest.mark.xfail(reason=KNOWN_WRONG[name], strict=True)] if name in KNOWN_WRONG else []
            cases.append(pytest.param(name, n, id=f"{name}-{n}call", marks=marks))
    return cases


def _assistant_with_calls(name: str, n: int) -> dict[str, Any]:
    spec = family(name)
    calls = []
    for i, (function, arguments) in enumerate(CALLS[:n]):
        call_id = f"call{i:05d}" if spec["call_id_length"] == 9 else f"call_{i}"
        args = json.dumps(arguments) if spec["call_arguments"] == "string" else arguments
        calls.append({"id": call_id, "type": "function", "function": {"name": function, "arguments": args}})
    # DeepSeek-R1's template writes tool calls only for an assistant message whose content is None
    content = None if name == "deepseek_r1_distill_qwen" else ""
    return {"role": "assistant", "content": content, "tool_calls": calls}


@pytest.fixture
def harmony_vocab(monkeypatch: pytest.MonkeyPatch) -> None:
    """openai_harmony reads the o200k vocabulary from here instead of downloading it."""
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(DATA / "o200k_base"))


def _sampled(name: str, ids: list[int]) -> tuple[str, list[int]]:
    """The text vLLM's derender would parse, and the ids in the model's own vocabulary."""
    text = family_tokenizer(name).decode(ids, skip_special_tokens=False)
    if name == "gpt_oss":
        from vllm.entrypoints.openai.parser.harmony_utils import get_encoding

        return text, get_encoding().encode(text, allowed_special="all")
    return text, ids


def _parse(
    name: str,
    ids: list[int],
    *,
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None = None,
    with_tool_parser: bool = True,
) -> tuple[str | None, str | None, list[tuple[str, Any]]]:
    """(reasoning, content, [(name, arguments)]) as the serving layer's composed parser returns them."""
    spec = family(name)
    tokenizer = family_tokenizer(name)
    parser_cls = ParserManager.get_parser(
        tool_parser_name=spec["tool_parser"] if with_tool_parser else None,
        reasoning_parser_name=spec["reasoning_parser"] or None,
        enable_auto_tools=True,
        is_harmony=name == "gpt_oss",
        tokenizer=tokenizer,
    )
    assert parser_cls is not None
    request = ChatCompletionRequest(
        model=name, messages=QUESTION, tools=tools, chat_template_kwargs=chat_template_kwargs
    )
    parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=chat_template_kwargs or {})
    text, model_ids = _sampled(name, ids)
    reasoning, content, calls = parser.parse(
        text, request, enable_auto_tools=True, model_output_token_ids=model_ids
    )
    return reasoning, content, [(c.name, json.loads(c.arguments)) for c in calls or []]


@pytest.mark.parametrize(("name", "n"), _cases())
def test_tool_calls_rendered_by_the_family_template_are_parsed_by_its_vllm_parser(
    name: str, n: int, harmony_vocab: None
) -> None:
    ids = sampled_turn(name, QUESTION, _assistant_with_calls(name, n), TOOLS)
    _, content, calls = _parse(name, ids, tools=TOOLS)

    assert calls == CALLS[:n]
    assert not (content or "").strip()


@pytest.mark.parametrize("name", [f for f, s in FAMILIES.items() if s["max_calls_per_turn"] == 1])
def test_single_call_templates_refuse_two_calls_in_one_turn(name: str) -> None:
    if name == "gpt_oss":
        rendered = render(name, [*QUESTION, _assistant_with_calls(name, 2)], TOOLS)
        assert "to=functions.add" in rendered and "to=functions.lookup" not in rendered
        return
    with pytest.raises(jinja2.TemplateError, match="only supports single tool-calls"):
        render(name, [*QUESTION, _assistant_with_calls(name, 2)], TOOLS)


@pytest.mark.parametrize("name", [f for f, s in FAMILIES.items() if not s["renders_tool_calls"]])
def test_families_whose_template_drops_tool_calls_write_none_of_them(name: str) -> None:
    """These templates write only an assistant message's content, so no rendered call exists to parse."""
    assistant = {**_assistant_with_calls(name, 1), "content": ANSWER}
    turn = render(name, [*QUESTION, assistant], TOOLS).split(QUESTION[0]["content"])[-1]

    assert ANSWER in turn
    assert '"a"' not in turn and "add" not in turn


def _reasoning_turn(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An assistant message with reasoning where the template reads it, and the kwargs that switch it on."""
    spec = family(name)
    kwargs = {spec["thinking_kwarg"]: True} if spec["thinking"] == "switch" else {}
    if name == "gpt_oss":
        return {"role": "assistant", "thinking": REASONING, "content": ANSWER}, kwargs
    if name == "ministral_3":
        content = [{"type": "thinking", "thinking": REASONING}, {"type": "text", "text": ANSWER}]
        return {"role": "assistant", "content": content}, kwargs
    return {"role": "assistant", "reasoning_content": REASONING, "content": ANSWER}, kwargs


REASONING_FAMILIES = [f for f, s in FAMILIES.items() if s["reasoning_parser"]]


@pytest.mark.parametrize("name", REASONING_FAMILIES)
def test_reasoning_parser_splits_reasoning_from_answer(name: str, harmony_vocab: None) -> None:
    """Where the template leaves reasoning out of the history it renders (DeepSeek, SmolLM3, Granite), the
    sampled turn is the family's think tokens around the reasoning, then the answer the template rendered."""
    spec = family(name)
    assistant, kwargs = _reasoning_turn(name)
    ids = sampled_turn(name, QUESTION, assistant, **kwargs)
    tokenizer = family_tokenizer(name)
    if REASONING not in tokenizer.decode(ids):
        answer = tokenizer.decode(ids, skip_special_tokens=False)
        for marker in spec["think_tokens"]:
            answer = answer.split(marker)[-1]
        opening = "" if spec["think_in_prompt"] else spec["think_tokens"][0] + "\n"
        text = f"{opening}{REASONING}\n{spec['think_tokens'][1]}\n\n{answer.lstrip()}"
        ids = tokenizer.encode(text, add_special_tokens=False)

    reasoning, content, _ = _parse(name, ids, tools=None, chat_template_kwargs=kwargs, with_tool_parser=False)

    assert (reasoning or "").strip() == REASONING
    assert (content or "").strip() == ANSWER


@pytest.mark.parametrize("name", [f for f, s in FAMILIES.items() if s["thinking"] == "switch"])
def test_thinking_off_leaves_the_answer_as_content(name: str) -> None:
    spec = family(name)
    kwargs = {spec["thinking_kwarg"]: False}
    ids = sampled_turn(name, QUESTION, {"role": "assistant", "content": ANSWER}, **kwargs)

    reasoning, content, _ = _parse(name, ids, tools=None, chat_template_kwargs=kwargs, with_tool_parser=False)

    assert not (reasoning or "").strip()
    assert (content or "").strip() == ANSWER
