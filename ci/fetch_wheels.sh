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
# an index answering twice, as tomlkit 0.15.2 beside 0.15.3 on 2026-12-03).
keep_newest() {
  python3 - "$1" <<'PRUNE'
import pathlib, sys
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
newest = {}
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(wheel.name)
    kept = newest.setdefault(canonicalize_name(name), (version, wheel))
    if kept[1] is wheel:
        continue
    old, new = (kept[1], wheel) if version > kept[0] else (wheel, kept[1])
    old.unlink()
    print(f"{old.name}: removed, {new.name} is newer")
    newest[canonicalize_name(name)] = (max(version, kept[0]), new)
PRUNE
}
