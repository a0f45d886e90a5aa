"""The drift alarm: warn per update over the limit, stop after K in a row, name the servers."""

import logging

import pytest

from shared.config import load_config
from shared.errors import TriadError
from trainer.drift import DriftAlarm, batch_servers


def test_warns_per_update_and_stops_after_k_in_a_row(caplog):
    alarm = DriftAlarm(0.1, 3)
    servers = ["http://a:8000"]
    with caplog.at_level(logging.WARNING, logger="triad.trainer"):
        assert alarm.observe(1, 0.5, servers) and alarm.observe(2, 0.2, servers)
        assert not alarm.observe(3, 0.01, servers)  # back under: the count starts over
        assert alarm.observe(4, 0.3, servers) and alarm.observe(5, 0.3, servers)
        with pytest.raises(
            TriadError,
            match=r"step 6: mismatch KL 0.4 between the sampler \(http://a:8000\)"
            r" .* over trainer.max_mismatch_kl = 0.1 for 3 updates in a row",
        ):
            alarm.observe(6, 0.4, servers)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 4 and warned[0].startswith(
        "step 1: mismatch KL 0.5 between the sampler (http://a:8000)"
    )
    assert "1 of 3 in a row" in warned[0] and "2 of 3 in a row" in warned[3]


def test_off_and_the_default_stays_silent_on_measured_runs():
    off = DriftAlarm(None, 1)
    assert not off.observe(1, 1e9, [])
    cfg = load_config(None, [])
    default = DriftAlarm(cfg.trainer.max_mismatch_kl, cfg.trainer.mismatch_kl_steps)
    # the worst steps of float32 CPU runs measured here (tool and reasoning runs, 60-300 steps)
    assert not any(default.observe(i, v, []) for i, v in enumerate([3.6e-10, 4e-2, 3.1e-1, 2.9e-1, 1.4e-1]))


def test_servers_are_read_from_the_rows_metrics():
    rows = [{"server": s} for s in ("http://b", "http://a http://c", "http://b")]
    rows += [{"server": None}, {"server": ""}, {}]  # batches written before the column, or by hand
    assert batch_servers(rows) == ["http://a", "http://b", "http://c"]


def test_inf_set_on_the_command_line_turns_the_alarm_off():
    """TOML and --set have no null: `inf` is how a user turns the alarm off."""
    limit = load_config(None, ["trainer.max_mismatch_kl=inf"]).trainer.max_mismatch_kl
    alarm = DriftAlarm(limit, 1)
    assert not any(alarm.observe(step, 1e6, ["s"]) for step in range(1, 5))
