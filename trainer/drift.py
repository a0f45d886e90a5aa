"""The drift alarm: the sampler and the trainer disagree on the policy.

`mismatch_kl` (per loss token, k3 of KL(sampler || trainer)) measures how far the
sampler's logprobs are from the trainer's for the same tokens and weights. It is
small when both sides compute the same policy (float32 CPU runs here: medians
2e-4..4e-3, the worst single steps 0.3); a wrong temperature, stale or corrupted
weights, or a tokenizer mismatch make it large on every step. Above
`trainer.max_mismatch_kl` the trainer warns once per version (update) with the
step, the servers that sampled the batch and the value; after
`trainer.mismatch_kl_steps` such updates in a row it stops.
"""

from __future__ import annotations

import logging

from shared.errors import TriadError

log = logging.getLogger("triad.trainer")


class DriftAlarm:
    def __init__(self, limit: float | None, steps: int, speak: bool = True) -> None:
        self.limit, self.steps, self.speak = limit, steps, speak
        self.in_a_row = 0

    def observe(self, step: int, value: float, servers: list[str]) -> bool:
        """Record update `step`'s mismatch KL: True if it is over the limit (warned); raises once
        `steps` updates in a row were."""
        if self.limit is None or value <= self.limit:
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        where = ", ".join(servers) or "unnamed servers"
        said = (
            f"step {step}: mismatch KL {value:.3g} between the sampler ({where}) and the trainer is over "
            f"trainer.max_mismatch_kl = {self.limit:g}"
        )
        if self.in_a_row >= self.steps:
            raise TriadError(
                f"{said} for {self.in_a_row} updates in a row: the sampler and the trainer disagree on the "
                "policy (sampling temperature, stale or corrupted weights, tokenizer?)"
            )
        if self.speak:
            log.warning("%s (%d of %d in a row before the run stops)", said, self.in_a_row, self.steps)
        return True


def batch_servers(rows: list[dict]) -> list[str]:
    """The servers that sampled a batch, from each row's `server` (space-separated URLs)."""
    return sorted({url for row in rows for url in (row.get("server") or "").split()})
