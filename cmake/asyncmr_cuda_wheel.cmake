# SPDX-License-Identifier: Apache-2.0
#
# The CUDA headers and static runtime from a PyPI wheel instead of a CUDA toolkit.
#
# asyncmr is host C++ that links the CUDA runtime statically, so a build needs only the
# runtime headers (with the crt/ headers they include) and libcudart_static.a. Wheels ship them:
#   CUDA 13: nvidia-cuda-runtime 13.x        -> site-packages/nvidia/cu13/{include,lib}
#            nvidia-cuda-crt 13.x            -> site-packages/nvidia/cu13/include/crt
#   CUDA 12: nvidia-cuda-runtime-cu12 12.9.x -> site-packages/nvidia/cuda_runtime/{include,lib}
#            (12.9 is the only 12.x runtime wheel that has libcudart_static.a)
#            nvidia-cuda-nvcc-cu12 12.9.x    -> site-packages/nvidia/cuda_nvcc/include/crt
#            (CUDA 12 has no crt wheel; nvcc itself is not used)
# CMake's FindCUDAToolkit (which librmm's rmm-config also calls) cannot use that layout as it
# is: it wants nvcc or a version.json beside include/, and an unversioned libcudart.so. So
# asyncmr_cuda_from_wheel() lays out a small toolkit-shaped directory in the build tree (links
# into the wheel plus a version.json) and points CUDAToolkit_ROOT at it. Everything else is
# CMake's own FindCUDAToolkit.
#
# The wheel is looked up on the Python interpreter's sys.path (the build environment under
# pip; PYTHONPATH and the venv otherwise). Its CUDA major follows the librmm-cuXX found first
# on sys.path, so a cu12 environment gets the 12.9 runtime even where CUDA 13 wheels are
# visible too.
#
# Nothing happens (CMake searches for a toolkit as usual) when CUDAToolkit_ROOT is set as a
# variable or in the environment, when CUDAToolkit was already found or the CUDA language is
# enabled, when ASYNCMR_CUDA_FROM_WHEEL is OFF, or when no runtime wheel with a static runtime
# is found.

include_guard(GLOBAL)

# Prints "<major>;<runtime wheel root>;<crt include dir>;<version>" for the runtime wheel to
# build against ("<crt include dir>" empty when its crt/ headers are missing), or nothing.
set(_asyncmr_cuda_wheel_probe [=[
import importlib.metadata as md, os, sys
want = None
for dist in md.distributions():  # in sys.path order
    name = (dist.metadata["Name"] or "").lower().replace("_", "-")
    if name in ("librmm-cu12", "librmm-cu13"):
        want = name[-2:]
        break
# (major, runtime dir, dist, where crt/ lives: CUDA 13 nvidia-cuda-crt shares the runtime's
# include/, CUDA 12 keeps it in nvidia-cuda-nvcc-cu12)
layouts = (("13", "cu13", "nvidia-cuda-runtime", ("cu13",)),
           ("12", "cuda_runtime", "nvidia-cuda-runtime-cu12", ("cuda_nvcc",)))
def find(rel):
    for entry in sys.path:
        path = os.path.join(entry or ".", "nvidia", rel)
        if os.path.exists(path):
            return path
for major, sub, dist_name, crt_subs in layouts:
    if want not in (None, major):
        continue
    api = find(os.path.join(sub, "include", "cuda_runtime_api.h"))
    if not api or not os.path.isfile(os.path.join(os.path.dirname(api), "..", "lib", "libcudart_static.a")):
        continue
    root = os.path.realpath(os.path.join(os.path.dirname(api), ".."))
    crt = ""
    for crt_sub in crt_subs:
        found = find(os.path.join(crt_sub, "include", "crt", "host_defines.h"))
        if found:
            crt = os.path.realpath(os.path.join(os.path.dirname(found), ".."))
            break
    try:
        version = md.version(dist_name)
    except md.PackageNotFoundError:
        version = ""
    print(f"{major};{root};{crt};{version}", end="")
    break
]=])

# Finds nvcc from the PyPI compiler wheels (nvidia-cuda-nvcc 13.x: nvidia/cu13/bin/nvcc) on the
# interpreter's sys.path; sets <out_var> to its path or to "" (for the C++ test kernels).
function(asyncmr_find_wheel_nvcc out_var)
  set(${out_var} "" PARENT_SCOPE)
  _asyncmr_python(python)
  if(NOT python)
    return()
  endif()
  execute_process(
    COMMAND "${python}" -c [=[
import os, sys
for entry in sys.path:
    for sub in ("cu13", "cuda_nvcc"):
        nvcc = os.path.join(entry or ".", "nvidia", sub, "bin", "nvcc")
        if os.access(nvcc, os.X_OK):
            print(os.path.realpath(nvcc), end="")
            sys.exit(0)
]=]
    OUTPUT_VARIABLE nvcc
    RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND nvcc)
    set(${out_var} "${nvcc}" PARENT_SCOPE)
  endif()
endfunction()

# The Python interpreter to ask: the one scikit-build-core or the caller named, else python3.
function(_asyncmr_python out_var)
  foreach(candidate IN ITEMS "${Python_EXECUTABLE}" "${Python3_EXECUTABLE}")
    if(candidate AND EXISTS "${candidate}")
      set(${out_var} "${candidate}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  find_program(_asyncmr_python3 NAMES python3 python NO_CACHE)
  set(${out_var} "${_asyncmr_python3}" PARENT_SCOPE)
endfunction()

function(asyncmr_cuda_from_wheel)
  option(ASYNCMR_CUDA_FROM_WHEEL
         "Take the CUDA headers and static runtime from the nvidia-cuda-runtime wheel" ON)
  # A toolkit someone chose (or a CUDA compiler already enabled, whose toolkit FindCUDAToolkit
  # takes first) wins.
  if(NOT ASYNCMR_CUDA_FROM_WHEEL OR DEFINED CUDAToolkit_ROOT OR DEFINED ENV{CUDAToolkit_ROOT}
     OR CUDAToolkit_FOUND OR CMAKE_CUDA_COMPILER_LOADED)
    return()
  endif()
  _asyncmr_python(python)
  if(NOT python)
    message(STATUS "asyncmr: no Python interpreter to look for a CUDA runtime wheel with; "
                   "looking for a CUDA toolkit")
    return()
  endif()
  execute_process(COMMAND "${python}" -c "${_asyncmr_cuda_wheel_probe}"
                  OUTPUT_VARIABLE found RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT found)
    message(STATUS "asyncmr: no CUDA runtime wheel with libcudart_static.a on the sys.path of "
                   "${python}; looking for a CUDA toolkit")
    return()
  endif()
  list(GET found 0 major)
  list(GET found 1 wheel)
  list(GET found 2 crt)
  list(GET found 3 dist_version)
  if(NOT crt)
    if(major EQUAL 13)
      set(crt_package "nvidia-cuda-crt==13.*")
    else()
      set(crt_package "nvidia-cuda-nvcc-cu12==12.9.*")
    endif()
    message(WARNING "asyncmr: the CUDA runtime wheel at ${wheel} has no crt/ headers beside it "
                    "(pip install \"${crt_package}\"); looking for a CUDA toolkit instead")
    return()
  endif()

  # The headers decide what is compiled; take major.minor from them, the patch from the wheel.
  file(STRINGS "${wheel}/include/cuda_runtime_api.h" line
       REGEX "^#define CUDART_VERSION +[0-9]+" LIMIT_COUNT 1)
  if(NOT line MATCHES "([0-9]+)$")
    message(FATAL_ERROR "asyncmr: no CUDART_VERSION in ${wheel}/include/cuda_runtime_api.h")
  endif()
  math(EXPR cuda_major "${CMAKE_MATCH_1} / 1000")
  math(EXPR cuda_minor "(${CMAKE_MATCH_1} % 1000) / 10")
  set(cuda_patch 0)
  if(dist_version MATCHES "^${cuda_major}\\.${cuda_minor}\\.([0-9]+)")
    set(cuda_patch "${CMAKE_MATCH_1}")
  endif()
  set(version "${cuda_major}.${cuda_minor}.${cuda_patch}")

  # The toolkit-shaped directory: version.json (FindCUDAToolkit's marker when there is no nvcc),
  # include/ and lib64/ holding links into the wheels, libcudart.so naming the versioned
  # library. include/crt comes from the crt wheel (CUDA 12: nvidia-cuda-nvcc-cu12).
  set(root "${CMAKE_BINARY_DIR}/cuda-from-wheel")
  file(REMOVE_RECURSE "${root}")
  file(MAKE_DIRECTORY "${root}/bin" "${root}/include" "${root}/lib64")
  file(WRITE "${root}/version.json"
       "{\"cuda\": {\"name\": \"CUDA runtime wheel ${wheel}\", \"version\": \"${version}\"}}\n")
  file(GLOB headers RELATIVE "${wheel}/include" "${wheel}/include/*")
  list(REMOVE_ITEM headers crt)
  foreach(name IN LISTS headers)
    file(CREATE_LINK "${wheel}/include/${name}" "${root}/include/${name}" SYMBOLIC)
  endforeach()
  file(CREATE_LINK "${crt}/crt" "${root}/include/crt" SYMBOLIC)
  file(GLOB libs "${wheel}/lib/*")
  foreach(lib IN LISTS libs)
    get_filename_component(name "${lib}" NAME)
    file(CREATE_LINK "${lib}" "${root}/lib64/${name}" SYMBOLIC)
    if(name MATCHES "^libcudart\\.so\\.[0-9]+$")
      file(CREATE_LINK "${lib}" "${root}/lib64/libcudart.so" SYMBOLIC)
    endif()
  endforeach()

  message(STATUS "asyncmr: CUDA ${version} headers and static runtime from the wheel at ${wheel}")
  set(CUDAToolkit_ROOT "${root}" PARENT_SCOPE)
endfunction()
