"""`triad simulate` against measurement here: the embedded default's samples/s at η 0, 1, 2.

    python -m bench.simulate_measured predict CALIBRATION_RUN   # before the runs: writes the prediction
    python -m bench.simulate_measured compare RUN_ETA0 RUN_ETA1 RUN_ETA2
    python -m bench.simulate_measured self RUN ...   # after: each run calibrated on itself

`predict` calibrates on one run (its metrics alone) and writes the predicted samples/s at η 0, 1, 2,
with the time it was made, to bench/results/simulate_prediction.json; `compare` reads the runs made
afterwards and writes bench/results/simulate_measured.{json,md} with the ratio for each. `self`
(not a prediction) fits each run and simulates it at its own settings: what is left of the error
when the machine's load is the same, and how much of the η guard's holds the model reproduces;
it is appended to the same files."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from statistics import mean

from shared.rundir import ORCHESTRATOR, TRAINER, RunDir
from simulate.calibrate import calibrate, measured_outside_per_group, measured_samples_per_s, steady
from simulate.pipeline import simulate

RESULTS = Path(__file__).with_name("results")
PREDICTION = RESULTS / "simulate_prediction.json"
ETAS = (0, 1, 2)


def phases(rundir: RunDir) -> dict[str, float]:
    """What moves a run's speed that the prediction cannot know: its mean request time and trainer
    step (read, train, publish), over the steady rows. Equal settings on a shared machine give
    different values from run to run."""
    orch = steady(rundir.metrics.rows(ORCHESTRATOR))
    trainer = steady([r for r in rundir.metrics.rows(TRAINER) if "train_s" in r])
    spans = [d for r in orch for _, d in r.get("request_spans", [])]
    return {
        "request_s": mean(spans) if spans else 0.0,
        "trainer_step_s": mean(r.get("read_s", 0) + r["train_s"] + r["publish_s"] for r in trainer),
    }


def phase_text(p: dict[str, float]) -> str:
    return f"{p['request_s'] * 1000:.0f} / {p['trainer_step_s'] * 1000:.0f} ms"


def predict(calibration_run: str) -> None:
    rundir = RunDir(calibration_run)
    setup = calibrate(rundir)
    steps = rundir.read_run().config["max_steps"]
    results = {eta: simulate(setup.with_(max_async_level=eta, max_steps=steps)) for eta in ETAS}
    predicted = {eta: r.samples_per_s() for eta, r in results.items()}
    out = {
        "made_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "calibrated_on": calibration_run,
        "load_average": os.getloadavg(),
        "calibration_run_samples_per_s": measured_samples_per_s(rundir),
        "calibration_run_guard_share": measured_outside_per_group(rundir)[1],
        "calibration_run_phases": phases(rundir),
        "calibration": setup.notes.get("calibration", ""),
        "setup": setup.describe(),
        "predicted_samples_per_s": {str(k): v for k, v in predicted.items()},
        "predicted_guard_share": {str(k): r.guard_share() for k, r in results.items()},
    }
    PREDICTION.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["predicted_samples_per_s"]), "->", PREDICTION)


def compare(runs: list[str]) -> None:
    prediction = json.loads(PREDICTION.read_text())
    rows = []
    for eta, run in zip(ETAS, runs, strict=True):
        rundir = RunDir(run)
        if rundir.read_run().config["max_async_level"] != eta:
            raise SystemExit(f"{run} was not run at max_async_level {eta}")
        measured = measured_samples_per_s(rundir)
        predicted = prediction["predicted_samples_per_s"][str(eta)]
        guard = prediction.get("predicted_guard_share", {}).get(str(eta))
        rows.append(
            {
                "eta": eta,
                "run": run,
                "predicted": predicted,
                "measured": measured,
                "ratio": predicted / measured,
                "predicted_guard_share": guard,
                "measured_guard_share": measured_outside_per_group(rundir)[1],
                "phases": phases(rundir),
            }
        )
    made = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    record = {
        "predicted_at": prediction["made_at"],
        "measured_at": made,
        "rows": rows,
        "load_average": os.getloadavg(),
    }
    (RESULTS / "simulate_measured.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        f"# triad simulate against the embedded default here (predicted {prediction['made_at']}, "
        f"measured {made}; load average then {os.getloadavg()[0]:.1f} on 2 cores)",
        "",
        "| η | predicted samples/s | measured samples/s | predicted / measured "
        "| slot-seconds the η guard held empty: predicted / measured | mean request / trainer step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['eta']} | {r['predicted']:.0f} | {r['measured']:.0f} | {r['ratio']:.2f} "
        f"| {r['predicted_guard_share'] or 0:.0%} / {r['measured_guard_share']:.0%} "
        f"| {phase_text(r['phases'])} |"
        for r in rows
    ]
    if "calibration_run_phases" in prediction:
        lines += [
            "",
            f"The calibration run's mean request / trainer step: "
            f"{phase_text(prediction['calibration_run_phases'])}.",
        ]
    (RESULTS / "simulate_measured.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def self_check(runs: list[str]) -> None:
    rows = []
    for run in runs:
        rundir = RunDir(run)
        setup = calibrate(rundir)
        r = simulate(setup.with_(max_steps=rundir.read_run().config["max_steps"]))
        measured = measured_samples_per_s(rundir)
        rows.append(
            {
                "run": run,
                "eta": setup.max_async_level,
                "simulated": r.samples_per_s(),
                "measured": measured,
                "ratio": r.samples_per_s() / measured,
                "simulated_guard_share": r.guard_share(),
                "measured_guard_share": measured_outside_per_group(rundir)[1],
                "phases": phases(rundir),
            }
        )
    record = json.loads((RESULTS / "simulate_measured.json").read_text())
    record["each_run_on_itself"] = rows
    (RESULTS / "simulate_measured.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        "",
        "Each run calibrated on itself and simulated at its own settings (after the runs; not a prediction):",
        "",
        "| run | η | simulated samples/s | measured | simulated / measured "
        "| guard's empty slots: simulated / measured | mean request / trainer step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {Path(r['run']).name} | {r['eta']} | {r['simulated']:.0f} | {r['measured']:.0f} "
        f"| {r['ratio']:.2f} | {r['simulated_guard_share']:.0%} / {r['measured_guard_share']:.0%} "
        f"| {phase_text(r['phases'])} |"
        for r in rows
    ]
    with (RESULTS / "simulate_measured.md").open("a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:2] == ["predict"]:
        predict(sys.argv[2])
    elif sys.argv[1:2] == ["self"]:
        self_check(sys.argv[2:])
    else:
        compare(sys.argv[2:5])  # η=2 needs weights.keep >= 4: `--set weights.keep=4`
