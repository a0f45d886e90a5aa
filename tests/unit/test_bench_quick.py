"""bench.quick --base: a change against a commit, pair by pair, the order swapped every round."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import quick
from bench.suite import REPO, extract_commit


def fake_side_runs(monkeypatch, steps: dict[str, list[float]]) -> list[tuple[str, Path]]:
    """`side_run` answering each side's next step (hand-off: half of it); the calls, in order."""
    calls = []

    def side_run(workdir: Path, code: Path, name: str, n_steps: int) -> dict:
        side = "base" if code != REPO else "change"
        calls.append((name, code))
        step = steps[side].pop(0)
        return {"load_before": 0.5, "step_s": step, "handoff_s": step / 2}

    monkeypatch.setattr(quick, "side_run", side_run)
    return calls


def test_a_pair_runs_the_base_first_in_even_rounds_and_the_change_first_in_odd_ones(monkeypatch, tmp_path):
    base_code = tmp_path / "base-code"
    calls = fake_side_runs(monkeypatch, {"base": [0.200, 0.180], "change": [0.150, 0.190]})

    first = quick.one_pair(tmp_path, base_code, 0, 40)
    second = quick.one_pair(tmp_path, base_code, 1, 40)

    assert calls == [("base0", base_code), ("change0", REPO), ("change1", REPO), ("base1", base_code)]
    assert (first["first"], second["first"]) == ("base", "change")
    assert first["step_ratio"] == 0.150 / 0.200 and first["handoff_ratio"] == 0.075 / 0.100
    assert second["step_ratio"] == 0.190 / 0.180


def test_the_summary_counts_the_pairs_where_the_change_was_shorter(monkeypatch, tmp_path):
    fake_side_runs(monkeypatch, {"base": [0.200, 0.180, 0.210], "change": [0.150, 0.190, 0.168]})
    pairs = [quick.one_pair(tmp_path, tmp_path / "base-code", i, 40) for i in range(3)]

    s = quick.summary_vs(pairs, 40, "abc1234")

    assert s["command"] == "python -m bench.quick --base abc1234 --rounds 3 --steps 40"
    assert s["step_shorter"] == 2 and s["handoff_shorter"] == 2
    assert s["step_ratio"] == {"median": 0.168 / 0.210, "min": 0.150 / 0.200, "max": 0.190 / 0.180}
    page = quick.markdown_vs(s)
    assert "| 2 | change | 0.50 | 180 ms | 190 ms | 1.06 | 90 ms | 95 ms | 1.06 |" in page
    assert (
        "- step, change / base: median **0.80** (spread 0.75-1.06); the change's was the shorter in 2 of 3"
        in page
    )


def test_a_commits_code_is_extracted_as_git_has_it(tmp_path):
    code = extract_commit("HEAD", tmp_path / "base-code")
    committed = subprocess.run(
        ["git", "show", "HEAD:bench/quick.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert (code / "bench" / "quick.py").read_text() == committed
    assert (code / "services" / "cli.py").is_file()


def test_a_commit_git_does_not_know_is_one_line(tmp_path):
    with pytest.raises(
        SystemExit, match=r"^no-such-rev: git archive failed in .*; name a commit of this repository$"
    ):
        extract_commit("no-such-rev", tmp_path / "base-code")
