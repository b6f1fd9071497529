#!/usr/bin/env bash
# Fill DIR with what ci/gpu.sh's cudf and stacks stages need on a GPU host without a package
# registry, beyond the host's image: cuDF (libcudf, pylibcudf, cudf and what they import) and
# cuML (libcuml, libcuvs, libraft, libnvforest, their Python packages, treelite), in DIR/stacks;
# and a numpy < 2.5 in DIR/numpy (the host's numpy 2.5 breaks cuDF's numba-cuda, which calls
# np.row_stack), installed on the host into a folder of its own put before the site
# (STACKS_PYTHONPATH). Run it where PyPI is reachable.
#
#   ci/stack_wheels.sh DIR [--chunks CHUNKDIR]     (PYTHON=3.12 picks the host's interpreter)
#
# About 0.8 GB: too much for one transfer. With --chunks, ../shared/bigcarry.sh packs DIR/stacks
# and DIR/numpy into CHUNKDIR/c1, c2, ... and prints the transfers, one right after the other,
# each followed on the host by `mkdir -p /tmp/big && cp CHUNKDIR/cK/* /tmp/big/`; after the last,
# `bash ../shared/bigcarry.sh --join /tmp/big`, then the numpy wheel out of /tmp/big into its own
# folder and the run:
#
#   mkdir -p /tmp/npw && mv /tmp/big/numpy-*.whl /tmp/npw/ && \
#   python3 -m pip install -q --no-index --no-deps --target /tmp/np /tmp/npw/*.whl && \
#   STACKS_PYTHONPATH=/tmp/np bash ci/gpu.sh $OUT build consumer cudf stacks
#
# (ci/gpu.sh installs every wheel in /tmp/big into its site with the core wheels, in one pip
# call.) The versions are the ones checked on the GPU host (../shared/FACTS.md): the RAPIDS 26.10
# wheels for CUDA 13, nvJitLink >= 13.3 (libcuvs asks for __nvJitLinkCreate_13_3; the host's
# is older), cachetools (cudf imports it; the host has none).
set -euo pipefail
dir=${1:?usage: ci/stack_wheels.sh DIR [--chunks CHUNKDIR]}
shift
chunks=
if [ "${1:-}" = --chunks ]; then chunks=${2:?--chunks needs a folder}; fi
mkdir -p "$dir/stacks" "$dir/numpy"

# shellcheck source=ci/fetch_wheels.sh
source "$(dirname "$0")/fetch_wheels.sh"

# cuDF: the C++ library, its Python bindings and package, and what the host lacks.
fetch "$dir/stacks" 'libcudf-cu13==26.10.*' 'pylibcudf-cu13==26.10.*' 'cudf-cu13==26.10.*' \
  'libkvikio-cu13==26.10.*' 'nvidia-libnvcomp-cu13==5.3.0.16' 'nvidia-nvjitlink>=13.3,<14' \
  nvtx cachetools
# cuML: the C++ libraries it links and its Python packages.
fetch "$dir/stacks" 'cuml-cu13==26.10.*' 'libcuml-cu13==26.10.*' 'libcuvs-cu13==26.10.*' \
  'libraft-cu13==26.10.*' 'pylibraft-cu13==26.10.*' 'libnvforest-cu13==26.10.*' \
  'nvforest-cu13==26.10.*' 'treelite==4.*'
fetch "$dir/numpy" 'numpy>=2.4,<2.5'
keep_newest "$dir/stacks"
keep_newest "$dir/numpy"
du -sh "$dir/stacks" "$dir/numpy"
if [ -n "$chunks" ]; then
  carry=$(cd "$(dirname "$0")/.." && pwd)/../shared/bigcarry.sh
  [ -f "$carry" ] || { echo "no $carry: pack DIR/stacks and DIR/numpy yourself" >&2; exit 1; }
  bash "$carry" "$chunks" "$dir"/stacks/*.whl "$dir"/numpy/*.whl
fi
