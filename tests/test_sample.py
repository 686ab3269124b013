"""batch --sample N --sample-seed S: a reproducible random sample of the selection."""

import pytest

from harness.providers import catalog


def _entries(n: int) -> list[catalog.Entry]:
    return [catalog.Entry(repo="r", op=f"op{i:03d}", op_file=f"f{i}", file=f"f{i}.py") for i in range(n)]


def test_sample_is_seeded_in_inventory_order_and_varies_with_the_seed():
    pool = _entries(200)
    picked = catalog.sample(pool, 20, seed=2026)
    assert len(picked) == len(set(picked)) == 20
    assert picked == catalog.sample(list(pool), 20, seed=2026)
    assert picked == sorted(picked, key=pool.index)
    assert picked != catalog.sample(pool, 20, seed=2027)
    # A bigger sample draws from the same stream: not the first 20 in order.
    assert [e.op for e in picked] != [e.op for e in pool[:20]]


def test_sample_larger_than_the_selection_keeps_it_all_and_zero_is_refused():
    pool = _entries(5)
    assert catalog.sample(pool, 9, seed=1) == pool
    with pytest.raises(catalog.SelectionError, match="--sample 0"):
        catalog.sample(pool, 0, seed=1)
