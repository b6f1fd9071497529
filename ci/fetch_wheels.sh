# Sourced by ci/build_wheels.sh and ci/stack_wheels.sh: fetch DEST SPEC... downloads the wheels
# of SPEC (no dependencies, binaries only) for the GPU host's interpreter ($PYTHON, default
# 3.12) and an x86-64 manylinux platform into DEST.
fetch() {
  local dest=$1
  shift
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "${PYTHON:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any \
    -d "$dest" "$@"
}
