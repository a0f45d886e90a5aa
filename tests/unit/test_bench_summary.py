"""bench/results/latest.md holds the newest figure of every bench's result file."""

from __future__ import annotations

import json
import shutil

import pytest

from bench import summary
from bench.suite import RESULTS


def test_every_result_file_has_a_reader_and_rows() -> None:
    found = summary.entries(RESULTS)
    assert set(found) == {p.name for p in summary.current_files(RESULTS)}
    for name, rows in found.items():
        assert rows, f"{name} gives no row"
        for row, date, command in rows:
            assert date[:4] == "2026" and command, (name, row)


def test_latest_md_is_current() -> None:
    """Each result file's newest figures appear in latest.md: it is what `bench.summary` makes of
    the files as they are (rerun `python -m bench.summary` after a bench)."""
    latest = (RESULTS / "latest.md").read_text()
    assert latest == summary.markdown(RESULTS)
    for rows in summary.entries(RESULTS).values():
        for row, date, _ in rows:
            assert f"| {' | '.join(row)} | {date} |" in latest


def test_history_is_left_out_and_a_file_without_a_reader_is_named(tmp_path) -> None:
    for name in ("suite.json", "simulate_measured_round1.json", "simulate_prediction_round2.json"):
        shutil.copy(RESULTS / name, tmp_path / name)
    assert [p.name for p in summary.current_files(tmp_path)] == ["suite.json"]
    (tmp_path / "new_bench.json").write_text(json.dumps({"date": "2026-11-26"}))
    with pytest.raises(SystemExit, match="new_bench.json: no reader"):
        summary.entries(tmp_path)
