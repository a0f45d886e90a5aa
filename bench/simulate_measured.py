"""`triad simulate` against measurement here: the embedded default's samples/s at η 0, 1, 2.

    python -m bench.simulate_measured predict CALIBRATION_RUN   # before the runs: writes the prediction
    python -m bench.simulate_measured compare RUN_ETA0 RUN_ETA1 RUN_ETA2

`predict` calibrates on one run (its metrics alone) and writes the predicted samples/s at η 0, 1, 2,
with the time it was made, to bench/results/simulate_prediction.json; `compare` reads the runs made
afterwards and writes bench/results/simulate_measured.{json,md} with the ratio for each."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

from shared.rundir import RunDir
from simulate.calibrate import calibrate, measured_samples_per_s
from simulate.pipeline import simulate

RESULTS = Path(__file__).with_name("results")
PREDICTION = RESULTS / "simulate_prediction.json"
ETAS = (0, 1, 2)


def predict(calibration_run: str) -> None:
    rundir = RunDir(calibration_run)
    setup = calibrate(rundir)
    predicted = {
        eta: simulate(setup.with_(max_async_level=eta, max_steps=60)).samples_per_s() for eta in ETAS
    }
    out = {
        "made_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "calibrated_on": calibration_run,
        "load_average": os.getloadavg(),
        "calibration_run_samples_per_s": measured_samples_per_s(rundir),
        "setup": setup.describe(),
        "predicted_samples_per_s": {str(k): v for k, v in predicted.items()},
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
        rows.append({"eta": eta, "run": run, "predicted": predicted, "measured": measured,
                     "ratio": predicted / measured})  # fmt: skip
    made = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    record = {"predicted_at": prediction["made_at"], "measured_at": made, "rows": rows,
              "load_average": os.getloadavg()}  # fmt: skip
    (RESULTS / "simulate_measured.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        f"# triad simulate against the embedded default here (predicted {prediction['made_at']}, "
        f"measured {made}; load average then {os.getloadavg()[0]:.1f} on 2 cores)",
        "",
        "| η | predicted samples/s | measured samples/s | predicted / measured |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {r['eta']} | {r['predicted']:.0f} | {r['measured']:.0f} | {r['ratio']:.2f} |" for r in rows]
    (RESULTS / "simulate_measured.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:2] == ["predict"]:
        predict(sys.argv[2])
    else:
        compare(sys.argv[2:5])  # η=2 needs weights.keep >= 4: `--set weights.keep=4`
