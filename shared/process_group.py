"""A process group outside torch.distributed's default one, for weight broadcasts.

Both trainer rank 0 and the inference workers build the same kind of group on a
`TCPStore` that rank 0 hosts: NCCL on GPU, Gloo on CPU. torch is imported only
when a group is made, so `shared` stays importable without it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def make_group(store: Any, rank: int, size: int, timeout: timedelta, cuda: bool) -> Any:
    if cuda:
        from torch.distributed import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(store, rank, size, options)
    from torch.distributed import ProcessGroupGloo

    return ProcessGroupGloo(store, rank, size, timeout)


def generation_store(store: Any, generation: int) -> Any:
    """Each generation's rendezvous keys under their own prefix, so an old one never interferes."""
    from torch.distributed import PrefixStore

    return PrefixStore(f"triad-broadcast-{generation}", store)
