# Source from the repository root (`source benchmarks/peers/activate.sh`) on the GPU host: unpacks
# whichever carried peer artifacts are present under .peers/ into $PEERS_DIR and puts them on
# PYTHONPATH; points relconv.datasets at the carried archive cache. Nothing is installed.
#   .peers/spconv_site.tar.xz             spconv-cu126 + cumm-cu126 + pccm, ccimport, fire, termcolor, lark
#   .peers/wcn_built/warpconvnet_built.tar.xz[.partNN]   from build_warpconvnet.sh, beside the wheels
#                                         of its runtime dependencies (jaxtyping, wadler-lindig, msgpack)
#   .peers/ts_built/torchsparse_built.tar.xz             from build_torchsparse.sh (torchsparse/,
#                                         the rootpath stand-in and backports.cached_property)
#   .peers/dgl_cp312/dgl-*.whl            DGL (CPU) for the graph suite's CPU cases
#   .peers/relconv_cache/archives/        small-gicp sdist and recbole wheel (real workloads)
PEERS_DIR=${PEERS_DIR:-/tmp/relconv-peers}
mkdir -p "$PEERS_DIR"
if [ -f .peers/spconv_site.tar.xz ] && [ ! -d "$PEERS_DIR/spconv" ]; then
  tar -xJf .peers/spconv_site.tar.xz -C "$PEERS_DIR"
fi
if compgen -G ".peers/wcn_built/warpconvnet_built.tar.xz*" >/dev/null && [ ! -d "$PEERS_DIR/warpconvnet" ]; then
  cat .peers/wcn_built/warpconvnet_built.tar.xz* | tar -xJ -C "$PEERS_DIR"
  for whl in .peers/wcn_built/*.whl; do
    [ -f "$whl" ] && python3 -m zipfile -e "$whl" "$PEERS_DIR"
  done
fi
if [ -f .peers/ts_built/torchsparse_built.tar.xz ] && [ ! -d "$PEERS_DIR/torchsparse" ]; then
  tar -xJf .peers/ts_built/torchsparse_built.tar.xz -C "$PEERS_DIR"
fi
if compgen -G ".peers/dgl_cp312/dgl-*.whl" >/dev/null && [ ! -d "$PEERS_DIR/dgl" ]; then
  python3 -m zipfile -e .peers/dgl_cp312/dgl-*.whl "$PEERS_DIR"
fi
export PYTHONPATH="$PEERS_DIR${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .peers/relconv_cache ]; then
  export RELCONV_CACHE="$PWD/.peers/relconv_cache"
fi
