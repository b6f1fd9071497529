# SPDX-License-Identifier: Apache-2.0
"""The asyncmr benchmark: asyncmr's resources against what users have today (RMM, cuda.core,
CuPy, cuDF), side by side in one run. Not part of the asyncmr package: it lives in the source
checkout and runs from there (``python -m asyncmr bench`` or ``python -m asyncmr_bench`` with
``benchmarks/`` on ``sys.path``); see ``benchmarks/README.md``.

Layout: ``common`` (names, statistics, tables; standard library only), ``harness`` (the run's
settings, shared objects, timing loops, metadata, JSON), ``floor`` (the C++ raw floor: the
``pool_floor`` program and the in-process ``libasyncmr_floor`` library), ``sections`` (one
module per section), ``targets`` (the target policy, recomputed from raw numbers; standard
library only, so ``check_targets.py`` runs anywhere) and ``plots``.
"""
