import gc

import pytest

from shared import heap


@pytest.fixture
def collector():
    """Nothing frozen before the test (so a freeze count is the test's own), and the process's
    threshold as it was, afterwards."""
    gc.unfreeze()
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    heap._before = None


def test_a_start_defers_full_collections_and_started_freezes_and_restores_them(collector):
    gc.set_threshold(700, 10, 10)
    heap.defer_full_collections()
    assert gc.get_threshold() == (700, 10, heap.DEFERRED)
    heap.defer_full_collections()  # a second call keeps the first one's threshold to restore
    made = [[i] for i in range(1000)]  # objects made while starting
    heap.started()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() >= len(made)
    swept = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
    assert not swept & {id(x) for x in made}  # frozen: in no generation a collection sweeps


def test_started_without_a_deferral_freezes_and_leaves_the_threshold(collector):
    gc.set_threshold(700, 10, 10)
    heap.started()
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() > 0
