#!/usr/bin/env bash
# Builds WarpConvNet from its PyPI sdist on a CUDA machine without network and packs the built
# package so that later runs only unpack it (see benchmarks/README.md, "Peers").
#
# Usage (repository root, with the sdist and the setuptools-scm wheel carried in .peers/wcn/):
#   OUT=/some/dir bash benchmarks/peers/build_warpconvnet.sh [.peers/wcn]
# Writes $OUT/warpconvnet_built.tar.xz, split into $OUT/warpconvnet_built.tar.xz.partNN pieces of
# at most 15 MiB when larger (join with `cat`). Takes about 9 minutes on 16 cores for sm_90 (1.8.2).
set -euo pipefail

SRC_DIR=${1:-.peers/wcn}
: "${OUT:?set OUT to the directory that receives the packed build}"
SDIST=$(ls "$SRC_DIR"/warpconvnet-*.tar.gz | head -n1)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

tar -C "$WORK" -xzf "$SDIST"
SRC=$(ls -d "$WORK"/warpconvnet-*/)
VERSION=$(basename "$SRC")
VERSION=${VERSION#warpconvnet-}

# setup.py reads its version through setuptools-scm, which the host lacks; it is a build-time
# dependency only, so it goes on PYTHONPATH for this build and is not packed.
python3 -m pip install --quiet --no-deps --no-index --target "$WORK/buildtools" "$SRC_DIR"/setuptools_scm-*.whl
export PYTHONPATH="$WORK/buildtools${PYTHONPATH:+:$PYTHONPATH}"
export SETUPTOOLS_SCM_PRETEND_VERSION="$VERSION"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-16}"

start=$(date +%s)
# --no-build-isolation: compile against the host's torch, not a freshly resolved one.
python3 -m pip install --no-build-isolation --no-deps --no-index --target "$WORK/site" "$SRC"
echo "build took $(( $(date +%s) - start )) s"

# The extension carries no debug info we need; dropping symbols shrinks what travels.
find "$WORK/site/warpconvnet" -name "_C*.so" -exec strip --strip-unneeded {} +
python3 - "$WORK/site" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import warpconvnet._C  # noqa: F401  (fails here, not on a later run, if the build is broken)
print("import ok")
PY

mkdir -p "$OUT"
# The installed metadata folder's name varies with the build backend, so pack whatever is there.
(cd "$WORK/site" && tar -cf - warpconvnet*) | xz -T0 -9 > "$WORK/warpconvnet_built.tar.xz"
size=$(stat -c %s "$WORK/warpconvnet_built.tar.xz")
if [ "$size" -le $((16 * 1024 * 1024)) ]; then
  cp "$WORK/warpconvnet_built.tar.xz" "$OUT/"
else
  split -b 15M -d "$WORK/warpconvnet_built.tar.xz" "$OUT/warpconvnet_built.tar.xz.part"
fi
ls -l "$OUT"
