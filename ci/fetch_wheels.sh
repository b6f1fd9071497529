# Sourced by ci/build_wheels.sh and ci/stack_wheels.sh.
#
# fetch DEST SPEC... downloads the wheels of SPEC (no dependencies, binaries only) for the GPU
# host's interpreter ($PYTHON, default 3.12) and an x86-64 manylinux platform into DEST.
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

# keep_newest DIR: one wheel per project in DIR, the newest. Whoever installs DIR/*.whl in one
# pip call needs it: pip refuses two versions of one project (an older download left in DIR, or
# an index answering twice, such as two patch releases of one project).
keep_newest() {
  python3 - "$1" <<'PRUNE'
import pathlib, sys
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
newest = {}  # project -> (version, wheel) of the newest wheel seen
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(wheel.name)
    key = canonicalize_name(name)
    if key in newest and newest[key][0] >= version:
        wheel.unlink()
        print(f"{wheel.name}: removed, {newest[key][1].name} is newer")
        continue
    if key in newest:
        newest[key][1].unlink()
        print(f"{newest[key][1].name}: removed, {wheel.name} is newer")
    newest[key] = (version, wheel)
PRUNE
}
