"""The tiny chat model's tokenizer and chat template, and the calculator environments.

Only the tokenizer (and, for its config, an untrained model) is built here, not the warmed-up
`builtin:tiny-tools` (`ensure_tiny_model("tiny-tools")`, about 40 s on two CPU cores)."""

from __future__ import annotations

import json
import random

import pytest

from orchestrator.environments import Prompt, load_environment
from orchestrator.envs import BUILTIN
from orchestrator.envs.calculator import ChatCalculator, TextCalculator, calculate
from orchestrator.tool_calls import ToolCall, parse_tool_calls
from services.tiny_model import (
    CHAT_SHAPE,
    RECIPES,
    assistant_mask,
    cache_name,
    calculate_schema,
    make_model,
    make_tokenizer,
)


def user(content: str) -> dict:
    return {"role": "user", "content": content}


QUESTION = user("12*34+5=?")


def call(expression: str, as_string: bool = True, call_id: str = "call00000") -> dict:
    arguments = {"expression": expression}
    function = {"name": "calculate", "arguments": json.dumps(arguments) if as_string else arguments}
    return {"id": call_id, "type": "function", "function": function}


def tool(content: str, call_id: str = "call00000") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": "calculate", "content": content}


def assistant(content: str = "", *calls: dict) -> dict:
    message = {"role": "assistant", "content": content}
    return {**message, "tool_calls": list(calls)} if calls else message


SOLVED = [QUESTION, assistant("", call("12*34+5")), tool("413"), assistant("413")]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(chat=True)


CALCULATE = calculate_schema()


def render(tok, messages, tools=(CALCULATE,), **kwargs) -> str:
    return tok.apply_chat_template(messages, tools=list(tools) or None, tokenize=False, **kwargs)


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_the_template_renders_tools_calls_and_results_exactly(tok):
    system = {"role": "system", "content": "Be brief."}
    assert render(tok, [system, *SOLVED]) == (
        "<|im_start|>system\nBe brief.\ntools: calculate(expression)<|im_end|>\n"
        "<|im_start|>user\n12*34+5=?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "12*34+5"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\n413<|im_end|>\n"
        "<|im_start|>assistant\n413<|im_end|>\n"
    )
    # arguments as an object render as the JSON string does; no system message: a system block of its own
    as_object = [QUESTION, assistant("", call("12*34+5", as_string=False)), tool("413"), assistant("413")]
    assert render(tok, as_object) == render(tok, SOLVED)
    assert render(tok, [QUESTION], add_generation_prompt=True) == (
        "<|im_start|>system\ntools: calculate(expression)<|im_end|>\n"
        "<|im_start|>user\n12*34+5=?<|im_end|>\n<|im_start|>assistant\n"
    )
    # without tools: plain ChatML, a system message as it is
    assert render(tok, [system, QUESTION], tools=()) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12*34+5=?<|im_end|>\n"
    )
    two_calls = assistant("Let me check.", call("1+1"), call("2*3", call_id="call00001"))
    assert render(tok, [two_calls], tools=()) == (
        "<|im_start|>assistant\nLet me check.\n"
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2*3"}}\n</tool_call><|im_end|>\n'
    )
    no_parameters = {"type": "object", "properties": {}}
    other = {"type": "function", "function": {"name": "noop", "parameters": no_parameters}}
    assert render(tok, [QUESTION], tools=[CALCULATE, other]).startswith(
        "<|im_start|>system\ntools: calculate(expression), noop()<|im_end|>\n<|im_start|>user\n"
    )


def test_the_parser_reads_what_the_template_writes(tok):
    text = render(tok, [assistant("thinking", call("12*34+5"), call("7", call_id="call00001"))], tools=())
    turn = text.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    parsed = parse_tool_calls(turn)
    assert parsed.content == "thinking" and not parsed.errors
    assert parsed.calls == [
        ToolCall("call00000", "calculate", {"expression": "12*34+5"}),
        ToolCall("call00001", "calculate", {"expression": "7"}),
    ]


CONVERSATIONS = [
    SOLVED,
    [{"role": "system", "content": "Be brief."}, *SOLVED, user("and 2*3?"), assistant("6")],
    [QUESTION, assistant("<think>hm</think>\n413"), user("sure?"), assistant("yes, 413")],
    [QUESTION, assistant("x", call("1//0")), tool("error: calculate raised ValueError: division by zero")],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("tools", [(CALCULATE,), ()])
def test_a_conversation_s_tokens_extend_its_earlier_renderings(tok, conversation, tools):
    """Property 5: render(M) is a token prefix of render(M + N, add_generation_prompt=True)
    whenever M ends with an assistant message."""
    checked = 0
    for cut, message in enumerate(conversation, start=1):
        if message["role"] != "assistant":
            continue
        before = ids(tok, render(tok, conversation[:cut], tools))
        for more in range(cut, len(conversation) + 1):
            after = ids(tok, render(tok, conversation[:more], tools, add_generation_prompt=True))
            assert after[: len(before)] == before
            checked += 1
    assert checked


def test_drop_think_removes_earlier_assistant_thinking_only(tok):
    conversation = [
        QUESTION,
        assistant("<think>12*34 is 408</think>\n\n413"),
        user("sure?"),
        assistant("<think>check again</think>yes"),
    ]
    kept = render(tok, conversation, tools=())
    assert "<think>12*34 is 408</think>\n\n413" in kept and "<think>check again</think>yes" in kept
    dropped = render(tok, conversation, tools=(), drop_think=True)
    assert dropped == (
        "<|im_start|>user\n12*34+5=?<|im_end|>\n"
        "<|im_start|>assistant\n413<|im_end|>\n"
        "<|im_start|>user\nsure?<|im_end|>\n"
        "<|im_start|>assistant\n<think>check again</think>yes<|im_end|>\n"
    )
    # text before a think block stays; an assistant message after the last user message keeps its block
    early = [QUESTION, assistant("ok <think>a</think>\nb"), user("?")]
    assert "<|im_start|>assistant\nok b<|im_end|>" in render(tok, early, tools=(), drop_think=True)
    last = [QUESTION, assistant("<think>a</think>b"), tool("1"), assistant("<think>c</think>d")]
    assert render(tok, last, tools=(), drop_think=True) == render(tok, last, tools=())


def test_tokens_special_and_not(tok):
    specials = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    added = tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>", "<think>", "</think>"])
    assert specials == [256, 257, 258] and added == [259, 260, 261, 262] and len(tok) == 263
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    text = '<think>hm</think>\n<tool_call>\n{"name": "calculate"}\n</tool_call><|im_end|>'
    encoded = ids(tok, "<|im_start|>assistant\n" + text)
    assert encoded[0] == 257 and set(added) <= set(encoded) and encoded[-1] == 258
    assert tok.decode(encoded, skip_special_tokens=True) == "assistant\n" + text.removesuffix("<|im_end|>")
    # the text models' tokenizer is as it was: 256 bytes and end-of-text, no template
    plain = make_tokenizer()
    assert len(plain) == 257 and plain.eos_token == "<|endoftext|>" and not plain.chat_template


def test_the_chat_model_config_ends_turns_at_im_end(tok):
    model = make_model(tok, seed=0, **CHAT_SHAPE)
    assert model.config.max_position_embeddings == 512 and model.config.vocab_size == 263
    assert model.config.num_attention_heads == 4 and model.config.hidden_size == 128
    assert model.config.eos_token_id == model.generation_config.eos_token_id == 258
    assert model.config.pad_token_id == 258 and model.config.bos_token_id == 256
    assert RECIPES["tiny-tools"].chat and not RECIPES["tiny-addition"].chat
    assert cache_name("tiny-addition", RECIPES["tiny-addition"]) == "tiny-addition-v2-w137"
    assert cache_name("tiny-reverse", RECIPES["tiny-reverse"]) == "tiny-reverse-v2-w160"
    assert cache_name("tiny-tools", RECIPES["tiny-tools"]).startswith("tiny-tools-v2c")


def test_the_warm_up_trains_on_assistant_tokens_and_their_end(tok):
    env = ChatCalculator()
    prompt = env.sample(random.Random(0))
    encoded = ids(tok, render(tok, prompt.messages + env.demonstration(prompt)))
    trained = tok.decode([t for t, m in zip(encoded, assistant_mask(tok, encoded), strict=True) if m])
    assert trained == (
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "51*99+55"}}\n</tool_call><|im_end|>'
        "5104<|im_end|>"
    )


def test_calculate_results_and_errors():
    assert calculate("12*34+5") == "413" and calculate(" (2+3)*-4 ") == "-20" and calculate("7//2") == "3"
    errors = {
        "1//0": "division or modulo by zero",
        "2**10": "unsupported: BinOp",
        "x": "unsupported: Name",
        "1+": "syntax",
    }
    for expression, why in errors.items():
        with pytest.raises(ValueError, match=why):
            calculate(expression)


def test_the_chat_calculator_samples_questions_with_the_tool():
    env = load_environment("calculator")
    assert isinstance(env, ChatCalculator) and env.max_turns == 3 and list(env.tools) == [calculate]
    prompt = env.sample(random.Random(0))
    assert prompt == Prompt(messages=[{"role": "user", "content": "51*99+55=?"}], answer="5104")
    assert env.respond(prompt, [assistant("5104")]) is None


@pytest.mark.parametrize(
    "conversation, reward",
    [
        (SOLVED[1:], 1.0),
        ([assistant("The answer is 413.")], 1.0),
        ([*SOLVED[1:3], assistant("<think>408+5</think>413")], 1.0),
        ([*SOLVED[1:3], assistant("412")], 0.0),
        ([*SOLVED[1:3], assistant("413, no: 414")], 0.0),  # the last number counts
        ([*SOLVED[1:3], assistant("4130")], 0.0),
        ([*SOLVED[1:3], assistant("no idea")], 0.0),
        ([assistant("413", call("12*34+5"))], 0.0),  # still calling a tool
        ([assistant("413", call("12*34+5")), tool("413")], 0.0),
        ([assistant("413"), tool("error: truncated tool call: <tool_call> with no </tool_call>")], 0.0),
        ([assistant('413 <tool_call>\n{"name": "calculate"')], 0.0),
        ([], 0.0),  # no assistant message
        ([tool("413"), user("413")], 0.0),
    ],
)
def test_the_chat_calculator_rewards_the_last_answer_without_a_tool_call(conversation, reward):
    prompt = Prompt(messages=[QUESTION], answer="413")
    assert ChatCalculator().reward(prompt, conversation) == reward


def test_calculator_text_is_the_old_text_calculator():
    env = load_environment("calculator_text")
    assert isinstance(env, TextCalculator) and BUILTIN["calculator_text"] is TextCalculator
    assert env.name == "calculator_text" and env.max_turns == 3
    prompt = env.sample(random.Random(0))
    assert prompt == Prompt(text="51*99+55=? tool: calc(...)\n", answer="5104")
    assert env.respond(prompt, "let me calc(6*7)") == "\n= 42\n"
    assert env.respond(prompt, "calc(6*7)\n= 42\nthen calc(42+1)") == "\n= 43\n"
    assert env.respond(prompt, "calc(6*7)\n= 42\nhmm") == "\n= no tool call\n"
    assert env.respond(prompt, "calc(1//0)") == "\n= error\n"
    assert env.respond(prompt, "answer: 5104") is None
    assert env.reward(prompt, "calc(1)\n= 1\nanswer: 5104") == 1.0
    assert env.reward(prompt, "answer: 5103") == env.reward(prompt, "5104") == 0.0
