"""Built-in environments, by the name `orchestrator.env` uses."""

from __future__ import annotations

from orchestrator.envs.basic import Addition, ReverseText
from orchestrator.envs.calculator import ChatCalculator, TextCalculator
from orchestrator.envs.grade_school import GradeSchoolMath

BUILTIN = {
    "reverse": ReverseText,
    "addition": Addition,
    "grade_school_math": GradeSchoolMath,
    "calculator": ChatCalculator,
    "calculator_text": TextCalculator,
}
