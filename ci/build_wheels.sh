#!/usr/bin/env bash
# Fill DIR/build with what a GPU host without a package registry needs, beyond the wheelhouse
# groups (../shared/wheelhouse.sh DIR core cu12), to build asyncmr's two variants there.
# Run it where PyPI is reachable; carry DIR (ci/gpu.sh reads DIR/build).
#
#   ci/build_wheels.sh DIR          (PYTHON=3.12 picks the host's interpreter version)
#
# - rapids-build-backend and what it imports (pure Python, plus PyYAML and rpds-py builds for
#   that interpreter): the PEP 517 backend in pyproject.toml; hatch-fancy-pypi-readme (and
#   hatchling's pieces it imports), which scikit-build-core calls for the long description. ci/gpu.sh installs them into a
#   folder of their own on PYTHONPATH.
# - nvidia-cuda-runtime and nvidia-cuda-crt 13.0: the CUDA 13 headers and static runtime, so the
#   host's cu13 build takes them from wheels too, as every other build does.
# - cuda12-crt.tar.gz: crt/ (the headers cuda_runtime_api.h includes) from
#   nvidia-cuda-nvcc-cu12 12.9, unpacked where that wheel would put them
#   (nvidia/cuda_nvcc/include/crt). CUDA 12 has no crt wheel, and the 40 MB nvcc wheel does not
#   fit in one transfer beside the rest; these headers are all of it the build reads.
set -euo pipefail
dir=${1:?usage: ci/build_wheels.sh DIR}
out=$dir/build
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shellcheck source=ci/fetch_wheels.sh
source "$(dirname "$0")/fetch_wheels.sh"

fetch "$out" 'rapids-build-backend==0.4.1' 'rapids-dependency-file-generator>=1.13.3,<2' \
  PyYAML packaging tomlkit jsonschema jsonschema-specifications referencing rpds-py attrs \
  typing-extensions hatch-fancy-pypi-readme hatchling pathspec pluggy trove-classifiers \
  'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-crt==13.0.*'

keep_newest "$out"  # ci/gpu.sh installs every wheel of DIR/build at once

fetch "$work" 'nvidia-cuda-nvcc-cu12==12.9.*'
python3 - "$work"/nvidia_cuda_nvcc_cu12-*.whl "$out/cuda12-crt.tar.gz" <<'EOF'
import io, sys, tarfile, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "nvidia/cuda_nvcc/include/crt/"
with zipfile.ZipFile(wheel) as z, tarfile.open(dest, "w:gz") as t:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    assert any(n.endswith("/host_defines.h") for n in names), "no crt/host_defines.h in " + wheel
    for name in names:
        data = z.read(name)
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        t.addfile(info, io.BytesIO(data))
print(f"{dest}: {len(names)} crt headers from {wheel.rsplit('/', 1)[-1]}")
EOF
du -sh "$out"
