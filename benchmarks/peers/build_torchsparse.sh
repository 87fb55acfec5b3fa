#!/usr/bin/env bash
# Builds TorchSparse++ (mit-han-lab/torchsparse 2.1, not on PyPI) on a CUDA machine without network
# and packs the built package so that later runs only unpack it (see benchmarks/README.md, "Peers").
#
# Usage (repository root), with .peers/ts/ holding
#   torchsparse_src.tar.xz            `git archive` of the repository (torchsparse/, setup.py, ...)
#   libsparsehash-dev_*.deb           Google sparsehash headers (`apt-get download libsparsehash-dev`),
#     or sparsehash_include.tar.xz    the same headers from sparsehash's sources (sparsehash_headers.sh)
#   backports.cached_property-*.whl   imported by torchsparse.nn on some Pythons
#   OUT=/some/dir bash benchmarks/peers/build_torchsparse.sh [.peers/ts]
# Writes $OUT/torchsparse_built.tar.xz. About 3 minutes on 16 cores for sm_90.
set -euo pipefail

SRC_DIR=${1:-.peers/ts}
: "${OUT:?set OUT to the directory that receives the packed build}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

mkdir -p "$WORK/src" "$WORK/deb" "$WORK/site"
xz -dc "$SRC_DIR"/torchsparse_src.tar.xz | tar -x -C "$WORK/src"
# Headers only: unpack them beside the build rather than into / (nothing is installed).
if compgen -G "$SRC_DIR/libsparsehash-dev_*.deb" >/dev/null; then
  dpkg -x "$SRC_DIR"/libsparsehash-dev_*.deb "$WORK/deb"
else
  mkdir -p "$WORK/deb/usr" && tar -xJf "$SRC_DIR"/sparsehash_include.tar.xz -C "$WORK/deb/usr"
fi
export CPLUS_INCLUDE_PATH="$WORK/deb/usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
export FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"

start=$(date +%s)
# --no-build-isolation: compile against the host's torch; --no-deps: its install_requires name
# torchvision and rootpath, which the benchmarks never use (rootpath is satisfied below).
python3 -m pip install --no-build-isolation --no-deps --no-index --target "$WORK/site" "$WORK/src"
echo "build took $(( $(date +%s) - start )) s"

python3 -m pip install --quiet --no-deps --no-index --target "$WORK/site" "$SRC_DIR"/backports.cached_property-*.whl
# torchsparse.nn.functional.conv imports `rootpath` at module level and never calls it for the
# built-in configurations; an empty module satisfies the import.
[ -e "$WORK/site/rootpath.py" ] || echo '"""Import stand-in: torchsparse imports rootpath but the benchmarks never use it."""' >"$WORK/site/rootpath.py"
find "$WORK/site/torchsparse" -name "backend*.so" -exec strip --strip-unneeded {} +
python3 - "$WORK/site" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import torchsparse, torchsparse.nn  # noqa: E401  (fails here, not on a later run, if the build is broken)
print("import ok", torchsparse.__version__)
PY

mkdir -p "$OUT"
(cd "$WORK/site" && tar -cf - .) | xz -T0 -9 > "$OUT/torchsparse_built.tar.xz"
ls -l "$OUT"
