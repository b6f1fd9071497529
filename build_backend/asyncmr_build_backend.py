# SPDX-License-Identifier: Apache-2.0
"""asyncmr's PEP 517 backend: rapids-build-backend, with the CUDA variant chosen without nvcc.

rapids-build-backend (wrapping scikit-build-core) names the package ``asyncmr-cu<major>`` and
takes the CUDA-specific requirements from dependencies.yaml for ``cuda=<major>.<minor>``. It
reads that version from ``nvcc --version``, and fails when there is no nvcc. asyncmr needs no
nvcc (the headers and static runtime come from the nvidia-cuda-runtime wheel), so this module
decides the version first, in this order:

1. ``cuda=<major>.<minor>`` in rapids-build-backend's own ``matrix-entry`` setting:
   ``pip install . -C rapidsai.matrix-entry=cuda=12.9`` or ``RAPIDS_MATRIX_ENTRY=cuda=12.9``;
2. else the nvcc on PATH, as rapids-build-backend does (a RAPIDS CUDA 12 image gives cu12);
3. else CUDA 13.0: ``pip install .`` on a machine with only a driver gives asyncmr-cu13.

It also gives each variant its own build directory (``build/cu<major>-{wheel_tag}``) unless
``-C build-dir=...`` names one, so a CMake cache never carries one runtime into the other's
build. Everything else is rapids-build-backend's.
"""

import os
import re
import shutil
import sys

from rapids_build_backend import build as _rbb
from rapids_build_backend import impls as _impls
from rapids_build_backend.config import Config as _Config

VARIANTS = ("12", "13")
DEFAULT = ("13", "0")

# rapids-build-backend's nvcc probe, kept for step 2.
_nvcc_version = _impls._get_cuda_version


def cuda_version(config_settings=None):
    """(major, minor, why) of the variant to build; raises ValueError for an unknown variant."""
    entry = _Config(config_settings=config_settings).matrix_entry or ""
    match = re.search(r"(?:^|;)\s*cuda=(\d+)\.(\d+)\s*(?:;|$)", entry)
    if match:
        version, why = match.groups(), f"matrix-entry {entry!r}"
    elif shutil.which("nvcc"):
        try:
            version, why = tuple(_nvcc_version()), f"nvcc on PATH ({shutil.which('nvcc')})"
        except Exception as e:  # a broken nvcc says nothing about what to build
            version, why = DEFAULT, f"default (nvcc on PATH gave no version: {e})"
    else:
        version, why = DEFAULT, "default (no cuda= in matrix-entry, no nvcc on PATH)"
    if version[0] not in VARIANTS:
        raise ValueError(
            f"asyncmr builds for CUDA {' or '.join(VARIANTS)}, not CUDA {'.'.join(version)} "
            f"(from {why}); choose one with -C rapidsai.matrix-entry=cuda=13.0 or cuda=12.9")
    return version[0], version[1], why


def _prepare(config_settings):
    major, minor, why = cuda_version(config_settings)
    # The one function rapids-build-backend asks for the version (name suffix and matrix).
    _impls._get_cuda_version = lambda: (major, minor)
    _impls._get_cuda_suffix.cache_clear()
    settings = dict(config_settings or {})
    if "build-dir" not in settings and "SKBUILD_BUILD_DIR" not in os.environ:
        settings["build-dir"] = f"build/cu{major}-{{wheel_tag}}"
    print(f"asyncmr: building asyncmr-cu{major} (CUDA {major}.{minor}, from {why})",
          file=sys.stderr)
    return settings


def get_requires_for_build_wheel(config_settings=None):
    return _rbb.get_requires_for_build_wheel(_prepare(config_settings))


def get_requires_for_build_sdist(config_settings=None):
    return _rbb.get_requires_for_build_sdist(_prepare(config_settings))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _rbb.build_wheel(wheel_directory, _prepare(config_settings), metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _rbb.build_sdist(sdist_directory, _prepare(config_settings))


# The optional hooks exist exactly when rapids-build-backend offers them (it offers them when
# scikit-build-core does): a hook that exists changes what the frontend does.
if hasattr(_rbb, "prepare_metadata_for_build_wheel"):
    def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
        return _rbb.prepare_metadata_for_build_wheel(
            metadata_directory, _prepare(config_settings))

if hasattr(_rbb, "build_editable"):
    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        return _rbb.build_editable(wheel_directory, _prepare(config_settings), metadata_directory)

if hasattr(_rbb, "get_requires_for_build_editable"):
    def get_requires_for_build_editable(config_settings=None):
        return _rbb.get_requires_for_build_editable(_prepare(config_settings))

if hasattr(_rbb, "prepare_metadata_for_build_editable"):
    def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
        return _rbb.prepare_metadata_for_build_editable(
            metadata_directory, _prepare(config_settings))
