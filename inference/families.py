"""Which of vLLM's tool-call and reasoning parsers fit a model, from its chat template.

`inference.tool_parser = "auto"` (and `reasoning_parser`) pick by the marks a
family's template writes; the vendored templates of `tests/data/templates/`
check each rule. A template that matches none gets no parser: its turns are
plain content, and tool environments fail at start (`orchestrator/episodes/chat.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NONE = "none"


@dataclass(frozen=True)
class Family:
    name: str
    marks: tuple[str, ...]  # all of these are in the template
    tool_parser: str | None
    reasoning_parser: str | None = None
    thinking_marks: tuple[str, ...] = ()  # the reasoning parser applies if one is there too; none: always


# the first match wins: more specific families first
FAMILIES = (
    Family("gpt-oss", ("<|channel|>",), "openai", "openai_gptoss"),
    Family("mistral", ("[TOOL_CALLS]",), "mistral", "mistral", ("[THINK]",)),
    Family(
        "deepseek-v3.1", ("<｜tool▁calls▁begin｜>", "thinking"), "deepseek_v31", "deepseek_v3", ("<think>",)
    ),
    Family("deepseek-v3", ("<｜tool▁calls▁begin｜>",), "deepseek_v3", "deepseek_r1", ("<think>",)),
    Family("deepseek-r1", ("<｜Assistant｜>",), None, "deepseek_r1", ("<think>",)),
    Family("glm-4.5", ("<arg_key>",), "glm45", "glm45", ("<think>",)),
    Family("qwen3-coder", ("<tool_call>", "<function=", "<parameter="), "qwen3_coder", "qwen3", ("<think>",)),
    Family("granite-4", ("<|start_of_role|>", "<tool_call>"), "granite4", "granite", ("thinking",)),
    Family("granite", ("<|start_of_role|>",), "granite", "granite", ("thinking",)),
    Family("smollm3", ("/no_think",), "hermes", "qwen3", ("<think>",)),
    Family("phi-4-mini", ("<|tool|>",), "phi4_mini_json"),
    Family("hermes", ("<tool_call>",), "hermes", "qwen3", ("<think>",)),
    Family("llama-3", ("<|start_header_id|>",), "llama3_json"),
)


def family_of(template: str) -> Family | None:
    return next((f for f in FAMILIES if all(mark in template for mark in f.marks)), None)


def parsers_for(
    template: str | None, tool_parser: str, reasoning_parser: str
) -> tuple[str | None, str | None]:
    """(tool parser, reasoning parser) for vLLM: the configured names, `auto` resolved by the
    template's family, `none` as None."""
    family = family_of(template) if template else None
    tool = tool_parser
    if tool == "auto":
        tool = family.tool_parser if family else None
    reasoning = reasoning_parser
    if reasoning == "auto":
        marks = family.thinking_marks if family is not None else ()
        thinks = family is not None and (not marks or any(mark in (template or "") for mark in marks))
        reasoning = family.reasoning_parser if thinks else None
    return (None if tool == NONE else tool), (None if reasoning == NONE else reasoning)


def chat_template_of(model_dir: Path) -> str | None:
    """The chat template a local model directory carries (`chat_template.jinja`, or
    `chat_template` in tokenizer_config.json); None if it has none or is not local."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = model_dir / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None
