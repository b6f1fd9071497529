#!/usr/bin/env bash
# Run a command where no CUDA toolkit can be seen, as on a machine with only a driver and pip:
#
#   ci/no_toolkit.sh CMD [ARG...]
#
# - Every CUDA toolkit directory (/usr/local/cuda*, /opt/cuda*, and the toolkit of each nvcc on
#   PATH) is covered by an empty read-only tmpfs in a private mount namespace, so nothing can
#   read it, whatever searches for it. That needs root and unshare; without them the toolkit
#   stays on disk, this says so, and the two steps below plus ci/check_build.py are the guard.
# - PATH keeps no directory that holds an nvcc; CUDA_HOME, CUDA_PATH, CUDACXX, CUDAToolkit_ROOT
#   and the compilers' search variables are unset.
# - CMake ignores the toolkit prefixes: CMAKE_ARGS (read by scikit-build-core) carries
#   CMAKE_IGNORE_PREFIX_PATH, and ASYNCMR_CMAKE_IGNORE holds the same -D for plain cmake calls.
# ASYNCMR_HIDDEN_TOOLKITS lists the directories for ci/check_build.py, which fails a build that
# used any of them.
set -euo pipefail

if [ "${ASYNCMR_NO_TOOLKIT:-}" != 1 ]; then
  hide=()
  add() {  # add DIR: a toolkit root (it has the runtime headers), once
    local d
    d=$(realpath -e "$1" 2>/dev/null) || return 0
    [ -e "$d/include/cuda_runtime_api.h" ] || compgen -G "$d/targets/*/include/cuda_runtime_api.h" \
      >/dev/null || return 0
    case " ${hide[*]-} " in *" $d "*) ;; *) hide+=("$d") ;; esac
  }
  for d in /usr/local/cuda /usr/local/cuda-* /opt/cuda /opt/cuda-*; do add "$d"; done
  while read -r n; do add "$(dirname "$(dirname "$(realpath "$n")")")"; done < <(type -ap nvcc || true)
  export ASYNCMR_HIDDEN_TOOLKITS="${hide[*]-}"
  if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
    exec unshare -m -- env ASYNCMR_NO_TOOLKIT=1 ASYNCMR_TOOLKITS_MOUNTED=1 bash "$0" "$@"
  fi
  echo "no_toolkit: no private mount namespace here (needs root and unshare): the toolkits" \
       "stay on disk; PATH, the environment, CMake's ignore list and ci/check_build.py guard" >&2
  export ASYNCMR_NO_TOOLKIT=1 ASYNCMR_TOOLKITS_MOUNTED=0
fi

if [ "${ASYNCMR_TOOLKITS_MOUNTED:-0}" = 1 ]; then
  for d in $ASYNCMR_HIDDEN_TOOLKITS; do
    mount -t tmpfs -o ro,size=4k asyncmr-no-toolkit "$d"
  done
fi

path=()
IFS=: read -r -a entries <<< "$PATH"
for p in "${entries[@]}"; do
  [ -n "$p" ] && [ ! -e "$p/nvcc" ] && path+=("$p")
done
PATH=$(IFS=:; echo "${path[*]}")
export PATH
unset CUDA_HOME CUDA_PATH CUDA_ROOT CUDACXX CUDAToolkit_ROOT CUDA_TOOLKIT_ROOT_DIR \
      CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH LIBRARY_PATH
ignore="/usr/local/cuda;${ASYNCMR_HIDDEN_TOOLKITS// /;}"
export ASYNCMR_CMAKE_IGNORE="-DCMAKE_IGNORE_PREFIX_PATH=${ignore%;}"
export CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }$ASYNCMR_CMAKE_IGNORE"

if command -v nvcc >/dev/null; then
  echo "no_toolkit: nvcc is still on PATH: $(command -v nvcc)" >&2
  exit 1
fi
for d in $ASYNCMR_HIDDEN_TOOLKITS; do
  if [ "$ASYNCMR_TOOLKITS_MOUNTED" = 1 ] && [ -n "$(ls -A "$d")" ]; then
    echo "no_toolkit: $d is still visible" >&2
    exit 1
  fi
done
echo "no_toolkit: hidden: ${ASYNCMR_HIDDEN_TOOLKITS:-none found}" \
     "($([ "$ASYNCMR_TOOLKITS_MOUNTED" = 1 ] && echo "empty tmpfs in a private mount namespace" \
         || echo "not mounted over")); no nvcc on PATH; CUDA_HOME/CUDA_PATH unset"
exec "$@"
