"""Regenerate grade_school_math.jsonl: templated two- and three-step word problems.

    python orchestrator/envs/data/make_grade_school_math.py

GSM8K-style items: a question, a worked solution ending in `#### <answer>`, and
the answer. Deterministic (seeded), so the shipped file is reproducible.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Ava", "Ben", "Chen", "Dina", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena"]
ITEMS = ["apples", "stickers", "marbles", "books", "pencils", "cookies", "shells", "cards"]


def shopping(r: random.Random) -> tuple[str, str, int]:
    n, price = r.randint(2, 9), r.randint(2, 12)
    paid = (n * price // 10 + 1) * 10
    q = f"{r.choice(NAMES)} buys {n} notebooks at ${price} each and pays with ${paid}. "
    q += "How much change, in dollars?"
    return q, f"{n} * {price} = {n * price}. {paid} - {n * price} = {paid - n * price}.", paid - n * price


def sharing(r: random.Random) -> tuple[str, str, int]:
    kids, each, extra = r.randint(2, 8), r.randint(3, 15), r.randint(1, 20)
    item, name = r.choice(ITEMS), r.choice(NAMES)
    total = kids * each + extra
    q = f"{name} has {total} {item}, keeps {extra} and shares the rest equally among {kids} friends. "
    q += "How many does each friend get?"
    return q, f"{total} - {extra} = {total - extra}. {total - extra} / {kids} = {each}.", each


def savings(r: random.Random) -> tuple[str, str, int]:
    weekly, weeks = r.randint(3, 25), r.randint(2, 12)
    spent = r.randint(1, min(30, weekly * weeks - 1))
    q = (
        f"{r.choice(NAMES)} saves ${weekly} a week for {weeks} weeks, then spends ${spent} on a game. "
        "How many dollars are left?"
    )
    return (
        q,
        f"{weekly} * {weeks} = {weekly * weeks}. {weekly * weeks} - {spent} = {weekly * weeks - spent}.",
        (weekly * weeks - spent),
    )


def speed(r: random.Random) -> tuple[str, str, int]:
    kmh, hours, more = r.randint(20, 90), r.randint(2, 6), r.randint(5, 60)
    q = f"A train travels at {kmh} km per hour for {hours} hours, then {more} km more. How many km in total?"
    return (
        q,
        f"{kmh} * {hours} = {kmh * hours}. {kmh * hours} + {more} = {kmh * hours + more}.",
        kmh * hours + more,
    )


def rows_of_seats(r: random.Random) -> tuple[str, str, int]:
    rows, seats, empty = r.randint(4, 20), r.randint(5, 30), r.randint(1, 15)
    q = f"A hall has {rows} rows of {seats} seats and {empty} seats are empty. How many people are seated?"
    return (
        q,
        f"{rows} * {seats} = {rows * seats}. {rows * seats} - {empty} = {rows * seats - empty}.",
        (rows * seats - empty),
    )


def baking(r: random.Random) -> tuple[str, str, int]:
    batches, per, boxes = r.randint(2, 6), r.randint(6, 24), r.randint(2, 4)
    total = batches * per
    eaten = total % boxes + boxes * r.randint(0, 2)
    left = total - eaten
    q = (
        f"{r.choice(NAMES)} bakes {batches} batches of {per} muffins, eats {eaten}, and packs the rest "
        f"into {boxes} equal boxes. How many muffins per box?"
    )
    return (
        q,
        f"{batches} * {per} = {total}. {total} - {eaten} = {left}. {left} / {boxes} = {left // boxes}.",
        (left // boxes),
    )


def percent(r: random.Random) -> tuple[str, str, int]:
    price, off = r.randint(1, 20) * 20, r.choice([10, 20, 25, 50])
    q = f"A jacket costs ${price:,}. It is {off}% off. What is the sale price in dollars?"
    cut = price * off // 100
    return q, f"{off}% of {price} = {cut}. {price} - {cut} = {price - cut}.", price - cut


TEMPLATES = [shopping, sharing, savings, speed, rows_of_seats, baking, percent]


def main() -> None:
    r = random.Random(1234)
    out = Path(__file__).with_name("grade_school_math.jsonl")
    seen: set[str] = set()
    with open(out, "w") as f:
        i = 0
        while len(seen) < 280:
            question, steps, answer = TEMPLATES[i % len(TEMPLATES)](r)
            i += 1
            if question in seen:
                continue
            seen.add(question)
            item = {"question": question, "solution": f"{steps}\n#### {answer}", "answer": str(answer)}
            f.write(json.dumps(item) + "\n")


if __name__ == "__main__":
    main()
