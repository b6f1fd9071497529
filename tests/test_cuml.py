# SPDX-License-Identifier: Apache-2.0
"""cuML on asyncmr: estimators fitted with an ``AsyncManagedMR`` as RMM's current resource give
the fits they give on RMM's ``ManagedMemoryResource``, within each estimator's tolerance. Runs
where cuML is installed (cuml-cu13 with libcuml, libcuvs, libraft, libnvforest, cuDF and an
nvJitLink >= 13.3); ASYNCMR_REQUIRE_CUML=1 makes its absence a failure."""

import importlib.util
import os

import numpy as np
import pytest

from gpu_helpers import not_applicable, require_module, rmm_cupy

ROWS, COLS = 50_000, 16


@pytest.fixture
def cuml(gpu):
    if importlib.util.find_spec("cuml") is None and os.environ.get("ASYNCMR_REQUIRE_CUML") != "1":
        not_applicable("cuML is not installed (it is carried to the GPU host on its own)")
    return require_module("cuml", "the cuML stack is tested with the real cuML")


def _data():
    rng = np.random.default_rng(20261202)
    x = rng.standard_normal((ROWS, COLS), dtype=np.float32)
    w = rng.standard_normal(COLS).astype(np.float32)
    y_reg = x @ w + 0.01 * rng.standard_normal(ROWS).astype(np.float32)
    y_cls = (y_reg > 0).astype(np.int32)
    return x, y_reg, y_cls


def _fits(cuml, resource):
    """Every estimator's result, fitted with ``resource`` as RMM's current resource."""
    import cupy

    with rmm_cupy(resource):
        x, y_reg, y_cls = (cupy.asarray(a) for a in _data())
        from cuml.cluster import KMeans
        from cuml.ensemble import RandomForestClassifier
        from cuml.linear_model import LogisticRegression, Ridge

        kmeans = KMeans(n_clusters=8, random_state=1, n_init=1, max_iter=50).fit(x)
        logistic = LogisticRegression(max_iter=200).fit(x, y_cls)
        forest = RandomForestClassifier(n_estimators=20, max_depth=8, random_state=1,
                                        n_streams=1).fit(x, y_cls)
        ridge = Ridge(alpha=1.0).fit(x, y_reg)
        out = {"inertia": float(kmeans.inertia_),
               "logistic": cupy.asnumpy(cupy.asarray(logistic.coef_)).ravel(),
               "forest": float((forest.predict(x) == y_cls).mean()),
               "ridge": cupy.asnumpy(cupy.asarray(ridge.coef_)).ravel()}
        cupy.cuda.runtime.deviceSynchronize()
        return out


def test_estimators_fit_alike_on_asyncmr_and_on_rmms_managed_memory(cuml):
    import rmm

    from asyncmr import AsyncManagedMR

    mr = AsyncManagedMR(pool="new")
    ours = _fits(cuml, mr)
    theirs = _fits(cuml, rmm.mr.ManagedMemoryResource())
    assert ours["inertia"] == pytest.approx(theirs["inertia"], rel=1e-4)
    np.testing.assert_allclose(ours["logistic"], theirs["logistic"], rtol=1e-3, atol=1e-4)
    assert abs(ours["forest"] - theirs["forest"]) <= 0.01
    np.testing.assert_allclose(ours["ridge"], theirs["ridge"], rtol=1e-4, atol=1e-5)
    assert mr.attributes.used_mem_high > 0, "cuML did not allocate through the asyncmr pool"
