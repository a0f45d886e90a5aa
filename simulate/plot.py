"""The advice's picture: a timeline of the last steps (trainer, batches, weight loads) above the
utilisation of the inference servers and the trainer per step."""

from __future__ import annotations

from pathlib import Path

from simulate.result import Result

COLOURS = {"train": "tab:blue", "publish": "tab:orange", "batch": "tab:green", "load": "tab:red"}


def plot(result: Result, out: Path, title: str, last: int = 8) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_u) = plt.subplots(2, 1, figsize=(10, 5.2), gridspec_kw={"height_ratios": [1.1, 1]})
    steps = sorted(result.written_at)
    shown = steps[-last:]
    origin = result.written_at.get(shown[0] - 1, 0.0)
    for step in shown:
        start = result.written_at.get(step - 1, 0.0)
        ax_t.broken_barh(
            [(start - origin, result.generated_at[step] - start)],
            (1.6, 0.7),
            facecolors=COLOURS["batch"],
            edgecolor="black",
            linewidth=0.3,
        )
        ax_t.text(
            (start + result.generated_at[step]) / 2 - origin,
            1.95,
            str(step),
            ha="center",
            va="center",
            fontsize=7,
        )
    for step, start, trained, published in result.train_spans:
        if step in shown:
            ax_t.broken_barh([(start - origin, trained - start)], (0.6, 0.7), facecolors=COLOURS["train"])
            ax_t.broken_barh(
                [(trained - origin, published - trained)], (0.6, 0.7), facecolors=COLOURS["publish"]
            )
    for version, start, end in result.load_spans:
        if version in shown:
            ax_t.broken_barh(
                [(start - origin, max(end - start, 1e-3))], (-0.4, 0.7), facecolors=COLOURS["load"]
            )
    ax_t.set_yticks([1.95, 0.95, -0.05], ["batches (filling)", "trainer", "weight loads"])
    ax_t.set_xlim(left=0)
    ax_t.set_xlabel("seconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax_t.legend(handles, list(COLOURS), loc="upper right", fontsize=7, ncol=4)
    ax_t.set_title(title, fontsize=9)
    util = result.step_utilisation()
    ax_u.plot([s for s, _, _ in util], [u for _, u, _ in util], label="inference decoding")
    ax_u.plot([s for s, _, _ in util], [t for _, _, t in util], label="trainer busy")
    ax_u.set_ylim(0, 1.05)
    ax_u.set_xlabel("step")
    ax_u.set_ylabel("utilisation")
    ax_u.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
