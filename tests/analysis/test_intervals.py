"""The interval arithmetic under every analysis, checked against a brute-force timeline."""

import numpy as np
import pytest

from rltrace.analysis import _intervals as iv


def _random(rng, n, groups=3, horizon=200):
    g = rng.integers(0, groups, n)
    s = rng.integers(0, horizon, n)
    return g, s, s + rng.integers(0, 30, n)


def _covered(g, s, e, group, horizon=260):
    mask = np.zeros(horizon, bool)
    for gi, si, ei in zip(g, s, e):
        if gi == group:
            mask[si:ei] = True
    return mask


@pytest.mark.parametrize("seed", range(5))
def test_union_total_and_complement_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    g, s, e = _random(rng, 40)
    ug, us, ue = iv.union(g, s, e)
    totals = iv.total(g, s, e, 3)
    lo, hi = np.array([10, 0, 50]), np.array([150, 260, 60])
    cg, cs, ce = iv.complement(g, s, e, lo, hi)
    for group in range(3):
        mask = _covered(g, s, e, group)
        assert totals[group] == mask.sum()
        assert np.array_equal(_covered(ug, us, ue, group), mask)
        sel = ug == group
        assert np.all(us[sel][1:] > ue[sel][:-1])  # disjoint, sorted, touching ones merged
        gap = np.zeros(260, bool)
        gap[lo[group] : hi[group]] = True
        assert np.array_equal(_covered(cg, cs, ce, group), gap & ~mask)


@pytest.mark.parametrize("seed", range(5))
def test_coverage_and_clip_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    g, s, e = _random(rng, 30)
    cov = iv.Coverage(g, s, e)
    qg, qa, qb = _random(rng, 25)
    got = cov.between(qg, qa, qb)
    ug, us, ue = iv.union(g, s, e)
    win, cs, ce = iv.clip(ug, us, ue, qg, qa, qb)
    for i in range(len(qg)):
        mask = _covered(g, s, e, qg[i])
        assert got[i] == mask[qa[i] : qb[i]].sum()
        pieces = np.zeros(260, bool)
        for a, b in zip(cs[win == i], ce[win == i]):
            pieces[a:b] = True
        window = np.zeros(260, bool)
        window[qa[i] : qb[i]] = True
        assert np.array_equal(pieces, mask & window)


def test_empty_inputs():
    assert iv.total([], [], [], 2).tolist() == [0, 0]
    cg, cs, ce = iv.complement([], [], [], np.array([0]), np.array([5]))
    assert (cg.tolist(), cs.tolist(), ce.tolist()) == ([0], [0], [5])
    assert iv.Coverage([], [], []).between([0], [0], [5]).tolist() == [0]


@pytest.mark.parametrize("seed", range(3))
def test_many_groups_over_a_long_time_range(seed):
    """10,000 steps of a long run in one batch: groups x time range exceeds int64, so keys fall
    back to ranks of the times; every answer still equals the small-range one shifted."""
    rng = np.random.default_rng(seed)
    groups = 40_000
    g, s, e = _random(rng, 4 * groups, groups=groups)
    shift = 10**15  # spread each group's intervals over ~1e15 ns: groups * range > 2**62
    far_s, far_e = s + (g % 7) * shift, e + (g % 7) * shift
    near = iv.total(g, s, e, groups)
    assert (iv.total(g, far_s, far_e, groups) == near).all()
    q = np.arange(groups)
    a, b = rng.integers(0, 100, groups), rng.integers(100, 260, groups)
    off = (q % 7) * shift
    near_cov = iv.Coverage(g, s, e).between(q, a, b)
    assert (iv.Coverage(g, far_s, far_e).between(q, a + off, b + off) == near_cov).all()
    brute = [int(_covered(g[g == k], s[g == k], e[g == k], k)[a[k]:b[k]].sum()) for k in range(0, groups, 997)]
    assert near_cov[::997].tolist() == brute
