"""Whether a server serves the bytes the trainer published: the weights marker's digests
(`shared/digest.py`, written by the trainer from the tensors it gathered) against the
ones the server computed from the tensors it loaded (`GET /admin/weights`)."""

from __future__ import annotations

from shared.admin_api import WeightsInfo
from shared.digest import first_difference
from shared.rundir import Marker


def published_digests(marker: Marker | None) -> dict[str, str] | None:
    digests = getattr(marker, "tensor_digests", None) if marker is not None else None
    return digests if isinstance(digests, dict) and digests else None


def mismatch(marker: Marker | None, info: WeightsInfo, required: bool = True) -> str | None:
    """None if the server's tensors are the published ones, or there is nothing to compare
    (a trainer that wrote no digests; with `required` false, a server that reports none);
    else the first differing tensor, described."""
    expected = published_digests(marker)
    if expected is None or (info.tensor_digests is None and not required):
        return None
    if info.tensor_digests is None:
        return "the server reported no digest of what it loaded"
    if info.digest == getattr(marker, "digest", None) and info.tensor_digests == expected:
        return None
    name = first_difference(expected, info.tensor_digests)
    if name is None:
        return None
    published, loaded = expected.get(name, "nothing"), info.tensor_digests.get(name, "nothing")
    return f"first differing tensor {name!r} (published {published}, loaded {loaded})"
