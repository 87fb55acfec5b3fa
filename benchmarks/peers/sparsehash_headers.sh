#!/usr/bin/env bash
# Packs Google sparsehash's headers as build_torchsparse.sh takes them where no libsparsehash-dev
# .deb is at hand: the include/ tree of sparsehash's sources (src/google, src/sparsehash) with the
# sparseconfig.h that its configure writes on Linux (glibc, a C++11 compiler), which the source
# tree leaves to configure.
#
#   bash benchmarks/peers/sparsehash_headers.sh SPARSEHASH_SRC_DIR .peers/ts/sparsehash_include.tar.xz
# SPARSEHASH_SRC_DIR: a checkout or `git archive` of github.com/sparsehash/sparsehash.
set -euo pipefail

SRC=${1:?the sparsehash source directory}
DEST=${2:?the tarball to write}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

mkdir -p "$WORK/include"
cp -r "$SRC/src/google" "$SRC/src/sparsehash" "$WORK/include/"
cat >"$WORK/include/sparsehash/internal/sparseconfig.h" <<'H'
/* sparsehash's configuration, as its configure writes it on Linux with glibc and a C++11 compiler. */
#define GOOGLE_NAMESPACE ::google
#define HASH_FUN_H <functional>
#define HASH_NAMESPACE std
#define HAVE_INTTYPES_H 1
#define HAVE_LONG_LONG 1
#define HAVE_MEMCPY 1
#define HAVE_STDINT_H 1
#define HAVE_SYS_TYPES_H 1
#define HAVE_UINT16_T 1
#define HAVE_U_INT16_T 1
#define SPARSEHASH_HASH HASH_NAMESPACE::hash
#define _END_GOOGLE_NAMESPACE_ }
#define _START_GOOGLE_NAMESPACE_ namespace google {
H
# The deprecated google/ headers read their own copy.
cp "$WORK/include/sparsehash/internal/sparseconfig.h" "$WORK/include/google/sparsehash/sparseconfig.h"
printf '#include <google/dense_hash_map>\nint main() { google::dense_hash_map<long, long> m; m.set_empty_key(-1); m[1] = 2; return m[1] == 2 ? 0 : 1; }\n' >"$WORK/check.cpp"
c++ -std=c++17 -I"$WORK/include" "$WORK/check.cpp" -o "$WORK/check" && "$WORK/check"
tar -cJf "$DEST" -C "$WORK" include
echo "wrote $DEST"
