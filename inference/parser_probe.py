"""`auto` tool-call and reasoning parsers by reading back what the chat template itself writes.

A template that a family of `inference/families.py` knows gets that family's parsers (the fast
path). Any other is probed: it renders one assistant turn holding a reasoning block and one tool
call (`PROBE`), the ids the model would have sampled are cut out of it (after the generation
prompt, up to the end-of-turn token) and decoded with special tokens kept, as vLLM's derender
does, and each of vLLM's registered parsers parses them through the unified parser vLLM's
serving layer composes (`ParserManager.get_parser`). A parser fits when it reads back exactly:
the tool's name and arguments as values, the reasoning text. A template that writes no tool call
(or no reasoning) needs no parser for it; one that writes them where no parser reads them back is
refused in one line. The choice is kept per template, tokenizer vocabulary and vLLM version in
the machine's cache (`$TRIAD_CACHE/parsers`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.families import NONE, family_of, parsers_for
from shared.diskspace import CACHE_ADVICE
from shared.errors import TriadError
from shared.storage import atomic_write_bytes, machine_cache

AUTO = "auto"
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_word",
            "description": "Look a word up in the dictionary.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["word", "limit"],
            },
        },
    }
]
PROBE_CALL = ("lookup_word", {"word": "tea pot", "limit": 3})
PROBE_REASONING = "The user asks what a tea pot is, so I look the word up."
PROBE_QUESTION = [{"role": "user", "content": "What is a tea pot?"}]
LAST = "hf"  # vLLM's parser driven by the tokenizer's own response template: after the named ones


@dataclass(frozen=True)
class ProbeTurn:
    """The assistant turn as the model would sample it: decoded text, its ids, and what it writes."""

    text: str
    ids: list[int]
    writes_call: bool
    writes_reasoning: bool


def probe_turn(tokenizer: Any, end_ids: Sequence[int] = ()) -> ProbeTurn | None:
    """`PROBE`'s assistant turn through the tokenizer's chat template; None if the template
    renders no such conversation. The variants cover templates that want the arguments as a
    JSON string or the content None beside tool calls."""
    name, arguments = PROBE_CALL
    ends = {i for i in [tokenizer.eos_token_id, *end_ids] if i is not None}
    for args in (arguments, json.dumps(arguments)):
        for content in ("", None):
            call = {"id": "call00000", "type": "function", "function": {"name": name, "arguments": args}}
            assistant = {
                "role": "assistant",
                "content": content,
                "reasoning_content": PROBE_REASONING,
                "reasoning": PROBE_REASONING,
                "tool_calls": [call],
            }
            try:
                prompt = _encode(tokenizer, PROBE_QUESTION, add_generation_prompt=True)
                full = _encode(tokenizer, [*PROBE_QUESTION, assistant], add_generation_prompt=False)
            except Exception:  # noqa: BLE001 (a template raising on this variant: try the next)
                continue
            pairs = enumerate(zip(prompt, full, strict=False))
            common = next((i for i, (a, b) in pairs if a != b), min(len(prompt), len(full)))
            turn = full[common:]
            turn = next((turn[:i] for i, t in enumerate(turn) if t in ends), turn)
            text = tokenizer.decode(turn, skip_special_tokens=False)
            if name in text:
                return ProbeTurn(text, turn, True, PROBE_REASONING in text)
    return None


def _encode(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tools=PROBE_TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return tokenizer.encode(text, add_special_tokens=False)


def read_back(tokenizer: Any, turn: ProbeTurn, tool: str | None, reasoning: str | None) -> bool:
    """Whether vLLM's composed parser of `tool` and `reasoning` reads `turn` back exactly."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager

    try:
        with _quiet_vllm():
            parser_cls = ParserManager.get_parser(
                tool_parser_name=tool,
                reasoning_parser_name=reasoning,
                enable_auto_tools=True,
                tokenizer=tokenizer,
            )
            if parser_cls is None:
                return False
            request = ChatCompletionRequest(model="probe", messages=PROBE_QUESTION, tools=PROBE_TOOLS)
            parser = parser_cls(tokenizer, request.tools, chat_template_kwargs={})
            got_reasoning, _, calls = parser.parse(
                turn.text, request, enable_auto_tools=tool is not None, model_output_token_ids=turn.ids
            )
            got_calls = [(c.name, json.loads(c.arguments)) for c in calls or []]
    except Exception:  # noqa: BLE001 (a parser that does not fit this tokenizer or text)
        return False
    if reasoning is not None and (got_reasoning or "").strip() != PROBE_REASONING:
        return False
    return tool is None or got_calls == [PROBE_CALL]


@contextmanager
def _quiet_vllm() -> Iterator[None]:
    """Parsers that do not fit log their failures: the probe expects most to fail."""
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _candidates(configured: str, registered: list[str], hints: Sequence[str]) -> list[str | None]:
    if configured == NONE:
        return [None]
    if configured != AUTO:
        return [configured]
    hinted = [n for n in registered if n != LAST and any(n in h or h in n for h in hints)]
    rest = [n for n in registered if n not in hinted and n != LAST]
    return [*hinted, *rest, *([LAST] if LAST in registered else [])]


def choose_parsers(
    tokenizer: Any,
    tool_parser: str,
    reasoning_parser: str,
    end_ids: Sequence[int] = (),
    hints: Sequence[str] = (),
) -> tuple[str | None, str | None]:
    """(tool parser, reasoning parser) that read the template's own turn back (see the module
    docstring); `hints` (the model's `model_type`, architectures) are tried first. TriadError in one
    line where the template writes a tool call or reasoning that no parser reads back."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    turn = probe_turn(tokenizer, end_ids)
    tool_names = sorted(ToolParserManager.list_registered())
    reasoning_names = sorted(ReasoningParserManager.list_registered())
    tools = _candidates(tool_parser, tool_names, hints) if turn and turn.writes_call else [None]
    if turn is None or not turn.writes_reasoning or reasoning_parser == NONE:
        reasonings: Iterable[str | None] = [None] if reasoning_parser in (AUTO, NONE) else [reasoning_parser]
    else:
        candidates = _candidates(reasoning_parser, reasoning_names, hints)
        reasonings = (r for r in candidates if read_back(tokenizer, turn, None, r))
    read_reasoning = False
    for reasoning in reasonings:
        read_reasoning = True
        for tool in tools:
            if tool is None or read_back(tokenizer, turn, tool, reasoning):
                return tool, reasoning
    if not read_reasoning:
        raise _refusal("reasoning_parser", "the reasoning block", reasoning_names)
    raise _refusal("tool_parser", "the tool call", tool_names)


def _refusal(option: str, what: str, names: list[str]) -> TriadError:
    return TriadError(
        f"inference.{option} = 'auto': no vLLM parser reads back {what} the model's chat template writes; "
        f"set inference.{option} to one of vLLM's ({', '.join(names)}), or 'none' to serve it without"
    )


def auto_parsers(
    model_path: str, template: str | None, tool_parser: str, reasoning_parser: str
) -> tuple[str | None, str | None]:
    """The parsers vLLM serves `model_path` with: the configured names, `auto` by the family table
    where it knows `template` (the model's, `chat_template_of`), else by reading back
    (`choose_parsers`, cached); a model without a template gets none."""
    if AUTO not in (tool_parser, reasoning_parser) or not template or family_of(template):
        return parsers_for(template, tool_parser, reasoning_parser)
    tokenizer = _tokenizer(model_path)
    return ParserCache(machine_cache() / "parsers").choice(
        tokenizer, template, tool_parser, reasoning_parser, _model_hints(model_path), _end_ids(model_path)
    )


class ParserCache:
    """`choose_parsers`'s answers kept as one JSON file per template, vocabulary, vLLM version
    and configured names."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def choice(
        self,
        tokenizer: Any,
        template: str,
        tool_parser: str,
        reasoning_parser: str,
        hints: Sequence[str] = (),
        end_ids: Sequence[int] = (),
    ) -> tuple[str | None, str | None]:
        import vllm

        key = hashlib.sha256(
            json.dumps(
                [
                    template,
                    sorted(tokenizer.get_added_vocab().items()),
                    vllm.__version__,
                    tool_parser,
                    reasoning_parser,
                    list(hints),
                    list(end_ids),
                ]
            ).encode()
        ).hexdigest()
        path = self.directory / f"{key}.json"
        if path.is_file():
            kept = json.loads(path.read_text())
            return kept["tool_parser"], kept["reasoning_parser"]
        tool, reasoning = choose_parsers(tokenizer, tool_parser, reasoning_parser, end_ids, hints)
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"tool_parser": tool, "reasoning_parser": reasoning}).encode()
        atomic_write_bytes(path, data, CACHE_ADVICE)
        return tool, reasoning


def _tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _model_json(model_path: str, name: str) -> dict[str, Any]:
    path = Path(model_path) / name
    return json.loads(path.read_text()) if path.is_file() else {}


def _model_hints(model_path: str) -> list[str]:
    config = _model_json(model_path, "config.json")
    hints = [config.get("model_type"), *(config.get("architectures") or [])]
    return [h.lower() for h in hints if isinstance(h, str)]


def _end_ids(model_path: str) -> list[int]:
    """The ids vLLM stops on besides the tokenizer's eos: generation_config.json's eos_token_id."""
    ids = _model_json(model_path, "generation_config.json").get("eos_token_id")
    return [i for i in (ids if isinstance(ids, list) else [ids]) if isinstance(i, int)]
