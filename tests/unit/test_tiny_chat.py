"""The embedded chat model's parts (services/tiny_chat.py) on the real Qwen3 tokenizer and
template, and the calculator environments.

Only short warm-ups are run here, not the whole `builtin:tiny-tools` build
(`ensure_tiny_model("tiny-tools")`); the build's own sampled check guards that one."""

from __future__ import annotations

import json
import random

import pytest
import torch

from orchestrator.environments import Prompt, load_environment
from orchestrator.envs import BUILTIN
from orchestrator.envs.calculator import ChatCalculator, TextCalculator, calculate
from orchestrator.episodes.tool_calls import ToolCall, parse_tool_calls
from orchestrator.episodes.tools import tool_schema
from services import tiny_chat
from services.tiny_model import RECIPES, cache_name
from shared.errors import TriadError

EMPTY_THINK = "<think>\n\n</think>\n\n"  # Qwen3's generation prompt with enable_thinking=false
CALCULATE = tool_schema(calculate)


def user(content: str) -> dict:
    return {"role": "user", "content": content}


QUESTION = user("12*34+5=?")


def call(expression: str, call_id: str = "call00000") -> dict:
    function = {"name": "calculate", "arguments": json.dumps({"expression": expression})}
    return {"id": call_id, "type": "function", "function": function}


def tool(content: str, call_id: str = "call00000") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": "calculate", "content": content}


def assistant(content: str = "", *calls: dict) -> dict:
    message = {"role": "assistant", "content": content}
    return {**message, "tool_calls": list(calls)} if calls else message


SOLVED = [QUESTION, assistant("", call("12*34+5")), tool("413"), assistant("413")]


@pytest.fixture(scope="module")
def tok():
    return tiny_chat.load_tokenizer()


def test_the_vendored_tokenizer_is_qwen3_s(tok):
    assert len(tok) == 151669 and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok.convert_tokens_to_ids(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    )
    assert ids == [151643, 151644, 151645, 151657, 151658]
    assert tok.convert_tokens_to_ids(["<think>", "</think>"]) == [151667, 151668]
    assert tiny_chat.encode(tok, "12*34+5") == [16, 17, 9, 18, 19, 10, 20]  # one token per digit


def test_an_episode_is_the_template_s_rendering_as_the_orchestrator_appends_it(tok):
    env = ChatCalculator()
    prompt = env.sample(random.Random(0))
    ids, mask = tiny_chat.episode_ids(tok, prompt.messages + env.demonstration(prompt), [CALCULATE])
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert text.endswith(
        "<|im_start|>user\n51*99+55=?<|im_end|>\n<|im_start|>assistant\n"
        + EMPTY_THINK
        + '<tool_call>\n{"name": "calculate", "arguments": {"expression": "51*99+55"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5104\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n" + EMPTY_THINK + "5104<|im_end|>"
    )
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == (
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "51*99+55"}}\n</tool_call><|im_end|>'
        "5104<|im_end|>"
    )
    # the prompt's ids are the template's own rendering with the generation prompt, thinking off
    first = tok.apply_chat_template(
        prompt.messages, tools=[CALCULATE], add_generation_prompt=True, enable_thinking=False, tokenize=False
    )
    assert ids[: len(tiny_chat.encode(tok, first))] == tiny_chat.encode(tok, first) and first.endswith(
        EMPTY_THINK
    )


def test_with_thinking_on_the_model_writes_the_empty_think_block_and_history_drops_it(tok):
    """Thinking on: the generation prompt ends at the assistant header, the model's turn opens with
    the empty think block, and what is appended after a tool call is what the template writes after
    that turn in its rendering of the whole conversation (where the block is gone)."""
    env = ChatCalculator()
    prompt = env.sample(random.Random(0))
    conversation = prompt.messages + env.demonstration(prompt)
    ids, mask = tiny_chat.episode_ids(tok, conversation, [CALCULATE], thinking=True)
    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "51*99+55"}}\n</tool_call>'
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == EMPTY_THINK + call + "<|im_end|>" + EMPTY_THINK + "5104<|im_end|>"
    assert tok.decode(ids).endswith(
        "<|im_start|>user\n51*99+55=?<|im_end|>\n<|im_start|>assistant\n"
        + EMPTY_THINK
        + call
        + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5104\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n" + EMPTY_THINK + "5104<|im_end|>"
    )
    whole = tok.apply_chat_template(
        conversation[:-1], tools=[CALCULATE], add_generation_prompt=True, tokenize=False
    )
    assert whole.endswith(
        "<|im_start|>assistant\n" + call + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5104\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )  # the template's own rendering: the earlier turn's think block is not written


def test_the_parser_reads_the_calls_the_template_writes(tok):
    text = tiny_chat.assistant_text(
        tok, assistant("thinking", call("12*34+5"), call("7", "call00001")), [CALCULATE]
    )
    parsed = parse_tool_calls(text)
    assert parsed.content == "thinking" and not parsed.errors
    assert parsed.calls == [
        ToolCall("call00000", "calculate", {"expression": "12*34+5"}),
        ToolCall("call00001", "calculate", {"expression": "7"}),
    ]


def test_after_a_turn_come_the_tool_results_and_the_next_generation_prompt(tok):
    turn = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}}\n</tool_call>'
    after = tiny_chat.after_turn_text(tok, [QUESTION], turn, [tool("2"), tool("3", "call00001")], [CALCULATE])
    assert after == (
        "\n<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n" + EMPTY_THINK
    )


def test_the_chat_model_is_a_tied_qwen3_that_ends_turns_at_im_end(tok):
    model = tiny_chat.make_chat_model(tok, seed=0)
    c = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM" and c.tie_word_embeddings and c.vocab_size == 151936
    assert (c.hidden_size, c.num_hidden_layers, c.head_dim) == (128, 2, 32)
    assert c.eos_token_id == model.generation_config.eos_token_id == 151645 and c.pad_token_id == 151643
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert isinstance(RECIPES["tiny-tools"], tiny_chat.ChatRecipe)
    assert cache_name("tiny-addition", RECIPES["tiny-addition"]) == "tiny-addition-v2-w137"
    assert cache_name("tiny-tools", RECIPES["tiny-tools"]) == "tiny-tools-v2c4-w300+400"


def test_the_task_model_s_loss_is_the_whole_model_s_cross_entropy(tok):
    """Trained on the task's rows only, then written back with the other rows at zero: the
    whole model's loss (all 151,936 logits) is the one the warm-up computed."""
    env = ChatCalculator()
    recipe = tiny_chat.ChatRecipe(
        task="calculator", copy_steps=0, warmup_steps=0, warmup_lr=0, tool_share=0.5, target=0, batch=3
    )
    keep = tiny_chat.task_vocabulary(tok, env, recipe, seed=0)
    assert 50 < len(keep) < 400 and set(tiny_chat.encode(tok, "0123456789")) <= set(keep)
    model = tiny_chat.make_chat_model(tok, seed=0)
    small = tiny_chat.TaskModel(model, keep)
    with torch.no_grad():
        small.model.lm_head.weight.mul_(3.0)  # a change to the trained rows, which fill must carry over
    small.fill(model)
    weight = model.get_output_embeddings().weight
    held = torch.ones(len(weight), dtype=torch.bool)
    held[keep] = False
    assert not weight[held].any() and torch.equal(weight[keep], small.model.lm_head.weight)
    assert weight[keep].abs().sum(dim=1).gt(0).sum() == len(keep) - 1  # all but the padding row
    rows, masks = tiny_chat.warm_up_batch(
        tok, env, 3, tiny_chat.Phase([CALCULATE], 0.5, 0.5), random.Random(1)
    )
    with torch.no_grad():
        ours = small.loss(rows, masks)
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        labels = [
            [t if m else -100 for t, m in zip(r, mk, strict=True)] for r, mk in zip(rows, masks, strict=True)
        ]
        labels = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
        full = model(input_ids=ids, labels=labels).loss
    assert ours.item() == pytest.approx(full.item(), rel=1e-5)
    with pytest.raises(TriadError, match="outside the task's vocabulary"):
        small.loss([[*rows[0], 151000]], [[*masks[0], 1]])


SHORT = tiny_chat.ChatRecipe(
    task="calculator", copy_steps=2, warmup_steps=2, warmup_lr=1e-3, tool_share=0.5, target=0, batch=4
)


def short_build(tok) -> str:
    with tiny_chat.deterministic(seed=0):
        model = tiny_chat.make_chat_model(tok, seed=0)
        tiny_chat.warm_up_chat(model, tok, SHORT, seed=0)
    return tiny_chat.weights_digest(model)


def test_the_warm_up_is_the_same_whatever_the_caller_s_threads(tok):
    """The warm-up fixes its seed, thread count and deterministic algorithms itself: two builds
    from callers with different settings give the same weights, and the caller's are restored."""
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        torch.set_num_threads(1)
        one = short_build(tok)
        assert torch.get_num_threads() == 1 and not torch.are_deterministic_algorithms_enabled()
        torch.set_num_threads(3)
        torch.manual_seed(123)
        three = short_build(tok)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])
    assert one == three
    untrained = tiny_chat.make_chat_model(tok, seed=0)
    assert tiny_chat.weights_digest(untrained) != one  # the warm-up did change the weights


def test_a_build_below_its_target_fails_in_one_line_and_caches_nothing(tok, tmp_path):
    recipe = tiny_chat.ChatRecipe(
        task="calculator",
        copy_steps=0,
        warmup_steps=0,
        warmup_lr=0,
        tool_share=0.5,
        target=0.5,
        check_prompts=4,
        max_tokens=8,
    )
    with pytest.raises(TriadError) as e:
        tiny_chat.build_chat_model(tmp_path / "model", "tiny-tools", recipe)
    message = str(e.value)
    assert "\n" not in message and "builtin:tiny-tools" in message
    assert (
        "sampled reward of 0.00" in message
        and "below its target 0.50" in message
        and "warmup_steps" in message
    )
    assert not (tmp_path / "model").exists()


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


def test_the_copy_phase_s_episodes_all_call_the_tool_without_the_tool_instructions(tok):
    """The first phase's short episodes: every one calls the tool and copies its result, and
    none carries the template's tool instructions (the system block the served prompt has)."""
    env = ChatCalculator()
    short, _ = tiny_chat.warm_up_batch(tok, env, 6, tiny_chat.Phase([], 1.0), random.Random(2))
    served, _ = tiny_chat.warm_up_batch(tok, env, 6, tiny_chat.Phase([CALCULATE], 1.0), random.Random(2))
    for s, f in zip(short, served, strict=True):
        text, full = tok.decode(s), tok.decode(f)
        assert "<tools>" not in text and text.count("<tool_call>") == 1 and "<tool_response>" in text
        assert full.startswith("<|im_start|>system\n# Tools")
        assert full.endswith(text.split("<|im_start|>user", 1)[1])
        assert len(s) < len(f) - 100


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
def test_the_warm_up_s_episodes_are_what_the_orchestrator_s_renderer_appends(tok, thinking):
    """The warm-up's ids against triad's own chat path: the prompt, then each demonstrated turn,
    then what `ChatRenderer.after_turn` (the orchestrator's renderer, here over the template as
    transformers renders it) appends after it, for a tool episode."""
    import asyncio

    from orchestrator.episodes.render import ChatRenderer

    async def render(messages: list[dict], generation_prompt: bool) -> list[int]:
        return tiny_chat.encode(
            tok, tiny_chat.render(tok, messages, [CALCULATE], generation_prompt, thinking)
        )

    env = ChatCalculator()
    prompt = env.sample(random.Random(5))
    demonstration = env.demonstration(prompt)
    ids, _ = tiny_chat.episode_ids(tok, prompt.messages + demonstration, [CALCULATE], thinking)

    async def orchestrated() -> list[int]:
        renderer = ChatRenderer(render)
        out = await renderer.prompt(prompt.messages)
        first, result, answer = demonstration
        for turn, new in ((first, [result]), (answer, [])):
            sampled = tiny_chat.encode(tok, tiny_chat.assistant_text(tok, turn, [CALCULATE], thinking))
            sampled += [tok.convert_tokens_to_ids("<|im_end|>")]
            out += sampled
            if new:
                out += await renderer.after_turn(sampled, True, turn, new)
        return out

    assert ids == asyncio.run(orchestrated())
