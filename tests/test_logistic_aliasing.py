"""Aliased columns decided the same whether rows are repeated or weighted, or summed in another order
(issue 39, item 5): ml/_linalg.py's find_aliased against R's rule (QR of the design in order, tolerance
1e-7 on the column norms) on random rank-deficient designs, whole fits with weights against repeated
rows, and scikit-learn's sample-weight checks on the default (unpenalised) estimator."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_logistic import _host, on

from pystrom.ml import LogisticRegression
from pystrom.ml._linalg import find_aliased
from pystrom.ml._pass import PassTotals, xp_pass


def r_aliased(design: np.ndarray) -> list[int]:
    """R's glm rule on the design itself (intercept first): column j is aliased when what the kept
    columns before it leave unexplained has a norm below 1e-7 of its own (Gram-Schmidt, twice)."""
    basis = np.zeros((design.shape[0], 0))
    out = []
    for j in range(design.shape[1]):
        col = design[:, j]
        v = col - basis @ (basis.T @ col)
        v -= basis @ (basis.T @ v)
        if np.linalg.norm(v) > 1e-7 * np.linalg.norm(col):
            basis = np.column_stack([basis, v / np.linalg.norm(v)])
        else:
            out.append(j)
    return out


def rank_deficient(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fewer rows than columns, or exact combinations of columns, or a constant column; columns
    scaled by up to 1e+-3; integer weights with zeros."""
    p = int(rng.choice([2, 4, 16, 31, 64]))
    n = int(rng.integers(max(2, p // 4), 2 * p)) if rng.random() < 0.7 else int(rng.integers(p, 3000))
    scales = rng.choice([1.0, 1e3, 1e-3], size=p)
    X = (rng.random((n, p)) if rng.random() < 0.5 else rng.normal(size=(n, p))) * scales
    if p > 3 and rng.random() < 0.7:
        X[:, 2] = X[:, 0] * 3 - X[:, 1]
        X[:, 3] = X[:, 0] * 1e-3 + X[:, 1] * 7
    if rng.random() < 0.3:
        X[:, -1] = 5.0
    sw = rng.integers(0, 5, size=n)
    sw[0] = max(sw[0], 1)
    return X, (rng.random(n) < 0.5).astype(np.uint8), sw


def test_aliasing_is_the_same_for_weights_repeated_rows_and_r():
    # before: 29 of 199 such designs aliased differently with weights, repeated rows or R's rule
    rng = np.random.default_rng(39)
    differ = []
    for case in range(150):
        X, y, sw = rank_deficient(rng)
        k = X.shape[1]
        order = [k, *range(k)]  # R's: the intercept first
        weighted = PassTotals.unpack(xp_pass(np, X, y, sw.astype(float), (1.0, 1.0), np.zeros(k + 1)), k)
        perm = rng.permutation(int(sw.sum()))  # repeated, shuffled, summed in chunks of 7 rows
        Xr, yr = X.repeat(sw, axis=0)[perm], y.repeat(sw)[perm]
        repeated = PassTotals.unpack(xp_pass(np, Xr, yr, None, (1.0, 1.0), np.zeros(k + 1), chunk_rows=7), k)
        want = sorted(order[j] for j in r_aliased(np.column_stack([np.ones(len(yr)), Xr])))
        got_w, got_r = sorted(find_aliased(weighted.hessian, order)), sorted(find_aliased(repeated.hessian, order))
        if not got_w == got_r == want:
            differ.append((case, X.shape, len(got_w), len(got_r), len(want)))
    assert not differ, differ


def test_sklearn_check_data_alias_the_same_columns_in_any_summation_order():
    """check_sample_weight_equivalence_on_dense_data's data: 15 rows x 30 features, 9 rows weighted:
    rank 9 of 31 parameters, so 22 aliased. Before, its repeated rows summed in other orders aliased 21
    in 14 of these 39 orders (the pivots that should be 0 came out as +-3e-14 around the 1e-14 rule);
    the outside run saw 22 weighted, 21 repeated."""
    rng = np.random.RandomState(42)
    X, y, sw = rng.rand(15, 30), rng.randint(0, 3, size=15), rng.randint(0, 5, size=15)
    yb = (y == y[0]).astype(np.uint8)  # binary as scikit-learn's check makes it
    k = 30
    order = [k, *range(k)]
    weighted = PassTotals.unpack(xp_pass(np, X, yb, sw * 1.0, (1.0, 1.0), np.zeros(k + 1)), k).hessian
    assert len(find_aliased(weighted, order)) == 22
    Xr, yr = X.repeat(sw, axis=0), yb.repeat(sw)
    for chunk in range(1, 40):
        perm = np.random.default_rng(chunk).permutation(len(yr))
        pass_ = xp_pass(np, Xr[perm], yr[perm], None, (1.0, 1.0), np.zeros(k + 1), chunk_rows=chunk)
        assert find_aliased(PassTotals.unpack(pass_, k).hessian, order) == find_aliased(weighted, order), chunk


def test_nearly_collinear_columns_stay_as_r_keeps_them():
    """Kept by R (the unexplained part 1e-5 to 1e-6 of the column's norm): kept here too, while the
    same columns made exactly collinear are aliased."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=400)
    for eps in (1e-3, 1e-5, 1e-6):
        X = np.column_stack([x, x + eps * rng.normal(size=400), rng.normal(size=400)])
        H = PassTotals.unpack(xp_pass(np, X, (x > 0).astype(np.uint8), None, (1.0, 1.0), np.zeros(4)), 3).hessian
        assert find_aliased(H, [3, 0, 1, 2]) == [] == r_aliased(np.column_stack([np.ones(400), X]))
        X[:, 1] = x * 2.5
        H = PassTotals.unpack(xp_pass(np, X, (x > 0).astype(np.uint8), None, (1.0, 1.0), np.zeros(4)), 3).hessian
        assert find_aliased(H, [3, 0, 1, 2]) == [1]


def test_fit_with_weights_equals_fit_of_repeated_rows(device):
    """scikit-learn's sample-weight check, as a fit: 15 rows x 30 features and the like, complete
    separation included; the same aliased columns and the same predictions."""
    rng = np.random.RandomState(42)
    for case in range(6):
        n = 15
        X = rng.rand(n, 2 * n) if case == 0 else rng.rand(n, int(rng.randint(2, 40)))
        y = rng.randint(0, 2, size=n)
        sw = rng.randint(0, 5, size=n)
        if len(np.unique(y[sw > 0])) < 2:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            weighted = LogisticRegression().fit(on(device, X), on(device, y), sample_weight=on(device, sw * 1.0))
            repeated = LogisticRegression().fit(on(device, X.repeat(sw, axis=0)), on(device, y.repeat(sw)))
        assert list(weighted.aliased_) == list(repeated.aliased_), case
        np.testing.assert_allclose(_host(weighted.predict_proba(on(device, X))),
                                   _host(repeated.predict_proba(on(device, X))), rtol=1e-7, atol=1e-12)  # fmt: skip


@pytest.mark.parametrize("penalty", [None, "l2"])
def test_sklearn_sample_weight_checks(penalty):
    ec = pytest.importorskip("sklearn.utils.estimator_checks")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ec.check_sample_weight_equivalence_on_dense_data("LogisticRegression", LogisticRegression(penalty=penalty))
