from orchestrator.batches.staleness import is_fresh, lag, oldest_allowed_version, step_for_next_group


def test_oldest_allowed_version():
    assert oldest_allowed_version(step=1, max_async_level=0) == 0
    assert oldest_allowed_version(step=5, max_async_level=0) == 4
    assert oldest_allowed_version(step=5, max_async_level=1) == 3
    assert oldest_allowed_version(step=2, max_async_level=3) == 0


def test_freshness_and_lag():
    assert is_fresh(version=3, step=5, max_async_level=1)
    assert not is_fresh(version=2, step=5, max_async_level=1)
    assert lag(step=5, version=3) == 1
    assert lag(step=5, version=4) == 0


def test_groups_fill_batches_in_order():
    assert step_for_next_group(assembling_step=3, groups_ahead=0, batch_size=4) == 3
    assert step_for_next_group(assembling_step=3, groups_ahead=3, batch_size=4) == 3
    assert step_for_next_group(assembling_step=3, groups_ahead=4, batch_size=4) == 4
    assert step_for_next_group(assembling_step=3, groups_ahead=9, batch_size=4) == 5
