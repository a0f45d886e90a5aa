"""Each request's sampling seed (`orchestrator.sampling.seeded`): a pure function of the run's
`seed` and where the request falls in the run (the group's draw number or held-out index, the
episode in its group, the turn or agent call in its episode), so a rerun, or a resumed run, asks
the server for the same random numbers at the same place, whatever order the requests reach it in.

On the same weights that is the same tokens, as far as the server's logits are the same: a batch
of another shape can round them otherwise, unless vLLM runs batch-invariant kernels
(`VLLM_BATCH_INVARIANT=1`, GPU backends; vLLM then warns about any random sampling without a
seed, which is what this option gives each request). A
request for `n` samples gets one seed; vLLM gives its sample i the seed + i. Held-out prompts get
the same seeds at every evaluation, so two evaluations differ by the weights, not by the draws.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SEED_BYTES = 7  # below 2**56: an int64 for the server, with room for vLLM's seed + i


@dataclass(frozen=True)
class Seeds:
    """The seeds below one place of the run; `path` None: sampling is not seeded."""

    path: tuple[int | str, ...] | None = None

    @classmethod
    def of_run(cls, seed: int, seeded: bool) -> Seeds:
        return cls((seed,) if seeded else None)

    def at(self, *where: int | str) -> Seeds:
        """The seeds of a place inside this one."""
        return self if self.path is None else Seeds((*self.path, *where))

    @property
    def value(self) -> int | None:
        """This place's request seed; None: the server's own randomness."""
        if self.path is None:
            return None
        digest = hashlib.blake2b(repr(self.path).encode(), digest_size=SEED_BYTES).digest()
        return int.from_bytes(digest, "big")


UNSEEDED = Seeds()
