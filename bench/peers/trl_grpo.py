"""TRL's GRPOTrainer on triad's addition task, for the side-by-side benchmark.

Runs inside its own virtual environment (torch + trl, no triad), made by
`bench/trl_compare.py`:   python trl_grpo.py MODEL_DIR STEPS OUT.json MAX_TOKENS

Same task as triad's `addition` environment (single digits, reward 1 for the
exact answer), group size 8, 16 prompts per step, MAX_TOKENS completion tokens,
temperature 1, lr 3e-4, no KL term, one optimizer step per batch, on CPU
without vLLM. Writes per-step reward and time.
"""

import json
import random
import sys
import time

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def addition_dataset(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    prompts, answers = [], []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        prompts.append(f"{a}+{b}=")
        answers.append(str(a + b))
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


def exact_answer(completions, answer, **_):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)]


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times = []

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.time())


def main() -> None:
    model_dir, steps, out, max_tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    launched = time.time()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = GRPOConfig(
        output_dir="/tmp/trl-grpo-bench",
        use_cpu=True,
        use_vllm=False,
        bf16=False,
        per_device_train_batch_size=128,
        num_generations=8,
        gradient_accumulation_steps=1,
        max_completion_length=max_tokens,
        temperature=1.0,
        learning_rate=3e-4,
        beta=0.0,
        num_iterations=1,
        max_steps=steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        lr_scheduler_type="constant",
        warmup_steps=0,
    )
    times = StepTimes()
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=exact_answer,
        args=config,
        train_dataset=addition_dataset(16 * steps * 2),
        callbacks=[times],
    )
    started = time.time()
    trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    result = {
        "launched": launched,
        "started": started,
        "step_end_times": times.times,
        "rewards": rewards,
        "samples_per_step": 128,
    }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
