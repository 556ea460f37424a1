"""pystrom demo's table (demo.py _create_logreg): the same rows on every run of a size, whatever the
number of connections that generate it (seeded parts), in any order in the table."""

from __future__ import annotations

from pystrom.demo import _create_logreg


def test_the_demo_table_holds_the_same_rows_on_every_run(pg):
    got = []
    for workers in (1, 3, 8):
        name = pg.name("logreg")  # dropped after the test
        _create_logreg(pg.conninfo, name, 5_000, workers)
        got.append(pg.fetch(f"SELECT t, t_exact, x1, x2, x3, x4, x5 FROM {name} ORDER BY x1, x2"))
    assert len(got[0]) == 5_000
    assert got[0] == got[1] == got[2]
    assert 0.3 < sum(r[0] for r in got[0]) / 5_000 < 0.8  # both classes, as the rule and noise make them


def test_the_second_act_takes_rows_by_value():
    """About SEPARATED_ROWS rows, picked by x5 (no part of the rule), not the table's first rows, whose
    order the concurrent inserts decide."""
    import statistics

    from pystrom.demo import SEPARATED_ROWS, _separated_where

    assert _separated_where(SEPARATED_ROWS) is None and _separated_where(1_000) is None
    for rows in (300_000, 10_000_000):
        where = _separated_where(rows)
        assert where is not None and where.startswith("x5 < ")
        share = statistics.NormalDist().cdf(float(where.split("<")[1]))
        assert abs(share * rows - SEPARATED_ROWS) < 1e-4 * rows
