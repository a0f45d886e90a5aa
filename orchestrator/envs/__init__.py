"""Built-in environments, by the name `orchestrator.environment.name` uses, and the library adapters
that take a `prefix:name` (`reasoning_gym:<task>`, `verifiers:<environment id>`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from orchestrator.envs.basic import Addition, ReverseText
from orchestrator.envs.calculator import ChatCalculator, TextCalculator
from orchestrator.envs.grade_school import GradeSchoolMath
from orchestrator.envs.reasoning_gym_env import ReasoningGym
from orchestrator.envs.verifiers_env import VerifiersEnv

BUILTIN = {
    "reverse": ReverseText,
    "addition": Addition,
    "grade_school_math": GradeSchoolMath,
    "calculator": ChatCalculator,
    "calculator_text": TextCalculator,
    "reasoning_gym": ReasoningGym,
}

ADAPTERS: dict[str, Callable[[str], Any]] = {
    "reasoning_gym": lambda task: partial(ReasoningGym, task=task),
    "verifiers": lambda env_id: partial(VerifiersEnv, env_id),
}
