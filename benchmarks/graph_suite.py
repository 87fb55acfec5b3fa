"""Graph suite: one R-GCN layer and a 2-layer R-GCN, relconv vs PyG (GPU, CPU) and DGL (CPU).

Cases are named graph/<device>/<graph>/<kind>/... with kind
  layer/C<c>/<aggr>/<dtype>/<map>/<pass>   RGCNConv(C, C, R) with a root weight and bias
  rgcn2/<dtype>/<map>/<pass>               RGCNConv(16 -> 16, bases) -> ReLU -> RGCNConv(16 -> classes)
CPU cases end in /t1 or /tmax: the case runs with 1 thread or with every core (torch's intra-op
pool and DGL's OpenMP pool both set; the row's `threads` field holds the count).
map "fresh" builds relconv's graph map (DGL: its graph) inside the timed region, "cached" outside;
PyG has no map cache and runs the same call in both. pass "fwd" runs under no_grad, "fwd+bwd" adds
backward of a fixed upstream gradient (layer) or of the cross-entropy over labelled nodes (model).
Inputs are random features [N, C]; the first layer of the model takes 16 input features rather
than R-GCN's featureless one-hot input, whose [R, N, 16] weight would not fit for AM.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from benchmarks.harness.bench import PeerMissing, Prepared, Unsupported, run_case
from benchmarks.harness.floor import DTYPES, rgcn_layer_work
from benchmarks.harness.timing import rotation_count
from benchmarks.peers import dgl_peer, pyg_peer
from benchmarks.workloads import graphs, real

GPU_GRAPHS = ("AIFB", "MUTAG", "ml100k", "BGS", "AM")
CPU_GRAPHS = ("AIFB", "MUTAG", "ml100k")
HIDDEN = 16
FAST_RGCN_LIMIT = 16 * 2**30  # FastRGCNConv materialises one weight per edge


@dataclass
class Graph:
    edge_index: torch.Tensor
    edge_type: torch.Tensor
    num_nodes: int
    num_relations: int
    labels: torch.Tensor
    num_classes: int
    num_slots: int


def case_specs(devices: list[str], tiny: bool) -> list[dict]:
    specs = []
    for dev in devices:
        names = ("tiny",) if tiny else (GPU_GRAPHS if dev == "cuda" else CPU_GRAPHS)
        channels = (8,) if tiny else ((16, 64) if dev == "cuda" else (16,))
        dtypes = ("fp32",) if tiny or dev == "cpu" else ("fp32", "bf16")
        for g in names:
            aggrs = ("mean", "add") if g in ("tiny", "AIFB") else ("mean",)
            for c in channels:
                for aggr in aggrs:
                    for dt in dtypes:
                        for mp in ("fresh", "cached"):
                            for ps in ("fwd", "fwd+bwd"):
                                specs.append(
                                    dict(
                                        suite="graph",
                                        device=dev,
                                        graph=g,
                                        kind="layer",
                                        C=c,
                                        aggr=aggr,
                                        dtype=dt,
                                        map=mp,
                                        pass_=ps,
                                    )
                                )
            for ps in ("fwd", "fwd+bwd"):
                specs.append(
                    dict(
                        suite="graph",
                        device=dev,
                        graph=g,
                        kind="rgcn2",
                        C=HIDDEN,
                        aggr="mean",
                        dtype="fp32",
                        map="cached",
                        pass_=ps,
                    )
                )
    threaded = []
    for s in specs:
        if s["device"] == "cpu":
            threaded += [dict(s, threads=t) for t in ("t1", "tmax")]
        else:
            threaded.append(s)
    specs = threaded
    for s in specs:
        tail = (
            f"layer/C{s['C']}/{s['aggr']}/{s['dtype']}/{s['map']}"
            if s["kind"] == "layer"
            else f"rgcn2/{s['dtype']}/{s['map']}"
        )
        s["case"] = f"graph/{s['device']}/{s['graph']}/{tail}/{s['pass_']}"
        if "threads" in s:
            s["case"] += f"/{s['threads']}"
    return specs


def thread_count(name: str) -> int:
    """Threads of a CPU case: "t1" or "tmax" (every core the process may use)."""
    if name == "t1":
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def _threads(count: int | None, use_dgl: bool):
    """torch's (and DGL's, when loaded) CPU thread count for the case, restored after it."""
    if count is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(count)
    if use_dgl:
        dgl_peer.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(old)
        if use_dgl:
            dgl_peer.set_num_threads(old)


def load_graph(name: str, device: torch.device) -> Graph:
    if name == "ml100k":
        ei, et, n, r, _ = real.movielens_kg()
        # The real graph has no node labels: 1,000 random nodes get random classes (the model
        # case needs a loss, not a meaningful one).
        num_classes = 4
        gen = torch.Generator().manual_seed(0)
        labels = torch.full((n,), -1, dtype=torch.int64)
        labels[torch.randperm(n, generator=gen)[:1000]] = torch.randint(
            0, num_classes, (1000,), generator=gen
        )
    else:
        ei, et, n, r, labels = graphs.make_kg(name, seed=0)
        num_classes = graphs.STATS[name].num_classes
    slots = graphs.num_slots(ei, et, n)
    return Graph(ei.to(device), et.to(device), n, r, labels.to(device), num_classes, slots)


@contextlib.contextmanager
def _tf32(enabled: bool):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


class TwoLayer(torch.nn.Module):
    """conv1 -> ReLU -> conv2 where `call(conv, x, graph)` runs one layer in its library's API."""

    def __init__(self, conv1, conv2, call):
        super().__init__()
        self.conv1, self.conv2, self.call = conv1, conv2, call

    def forward(self, x, graph):
        return self.call(self.conv2, F.relu(self.call(self.conv1, x, graph)), graph)


def _source_layers(spec: dict, g: Graph) -> list[torch.nn.Module]:
    """The layers whose weights every implementation loads: relconv's, or PyG's (same state_dict)
    when relconv's graph front end is missing, so the peers can still be timed."""
    try:
        from relconv.graph import RGCNConv
    except ImportError:
        from torch_geometric.nn import RGCNConv

    torch.manual_seed(0)
    if spec["kind"] == "layer":
        return [RGCNConv(spec["C"], spec["C"], g.num_relations, aggr=spec["aggr"])]
    bases = min(30, g.num_relations)
    return [
        RGCNConv(HIDDEN, HIDDEN, g.num_relations, num_bases=bases, aggr="mean"),
        RGCNConv(HIDDEN, g.num_classes, g.num_relations, num_bases=bases, aggr="mean"),
    ]


def _prepare(spec: dict, g: Graph, device: torch.device, impl: str, ref_layers: list) -> Prepared:
    dtype = DTYPES[spec["dtype"]]
    n, r, aggr = g.num_nodes, g.num_relations, spec["aggr"]
    bases = None if spec["kind"] == "layer" else min(30, r)
    shapes = (
        [(spec["C"], spec["C"])] if spec["kind"] == "layer" else [(HIDDEN, HIDDEN), (HIDDEN, g.num_classes)]
    )

    if impl == "relconv":
        from relconv.graph import RGCNConv, build_rgcn_map

        if not isinstance(ref_layers[0], RGCNConv):
            raise Unsupported("relconv.graph unavailable")
        layers = ref_layers
        if spec["map"] == "cached":
            cached = build_rgcn_map(g.edge_index, g.edge_type, n, r, aggr)

            def graph_of():
                return cached
        else:

            def graph_of():
                return build_rgcn_map(g.edge_index, g.edge_type, n, r, aggr)

        def call(conv, x, graph):
            return conv(x, graph)
    elif impl in ("pyg", "pyg-fast"):
        kind = "RGCNConv" if impl == "pyg" else "FastRGCNConv"
        if impl == "pyg-fast":
            need = max(
                pyg_peer.fast_rgcn_bytes(g.edge_index.shape[1], a, b, dtype.itemsize) for a, b in shapes
            )
            if need * (3 if spec["pass_"] == "fwd+bwd" else 1) > FAST_RGCN_LIMIT:
                raise Unsupported(f"per-edge weights need {need / 2**30:.0f} GiB")
        layers = [
            pyg_peer.rgcn_layer(kind, ref.state_dict(), a, b, r, aggr, bases)
            for ref, (a, b) in zip(ref_layers, shapes, strict=False)
        ]

        def graph_of():
            return (g.edge_index, g.edge_type)

        def call(conv, x, graph):
            return conv(x, *graph)
    elif impl == "dgl":
        if device.type != "cpu":
            raise Unsupported("PyPI dgl is CPU-only")
        layers = [
            dgl_peer.rgcn_layer(ref.state_dict(), a, b, r, bases)
            for ref, (a, b) in zip(ref_layers, shapes, strict=False)
        ]

        def build():
            norm = dgl_peer.mean_norm(g.edge_index, g.edge_type, n) if aggr == "mean" else None
            return dgl_peer.make_graph(g.edge_index, n), norm

        if spec["map"] == "cached":
            cached_graph = build()

            def graph_of():
                return cached_graph
        else:
            graph_of = build

        def call(conv, x, graph):
            return conv(graph[0], x, g.edge_type, norm=graph[1])
    else:
        raise ValueError(impl)

    model = (layers[0] if spec["kind"] == "layer" else TwoLayer(layers[0], layers[1], call)).to(device, dtype)

    def forward(x):
        if spec["kind"] == "layer":
            return call(model, x, graph_of())
        return model(x, graph_of())

    c_in = shapes[0][0]
    gen = torch.Generator(device="cpu").manual_seed(1)
    bytes_per_input = n * c_in * dtype.itemsize
    xs = [
        torch.randn(n, c_in, generator=gen).to(device, dtype)
        for _ in range(rotation_count(bytes_per_input, device))
    ]
    tf32 = spec["dtype"] == "tf32"
    labelled = (g.labels >= 0).nonzero().squeeze(1)
    upstream = torch.randn(n, shapes[-1][1], generator=gen).to(device, dtype)

    if spec["pass_"] == "fwd":

        def fn(x):
            with torch.no_grad(), _tf32(tf32):
                return forward(x)
    else:
        for x in xs:
            x.requires_grad_(True)

        def fn(x):
            with _tf32(tf32):
                for p in model.parameters():
                    p.grad = None
                x.grad = None
                out = forward(x)
                if spec["kind"] == "layer":
                    out.backward(upstream)
                else:
                    F.cross_entropy(out[labelled].float(), g.labels[labelled]).backward()

    def output():
        with torch.no_grad(), _tf32(tf32):
            return None, forward(xs[0].detach()).float()

    return Prepared(
        fn=fn,
        inputs=xs,
        output=output,
        note="no map cache in PyG" if impl.startswith("pyg") and spec["map"] == "cached" else "",
    )


def run(spec: dict, ctx: dict, peers: dict, timing, ceilings) -> list[dict]:
    """Rows of one case; `ctx` keeps the current graph between cases."""
    device = torch.device(spec["device"])
    meta = {k: v for k, v in spec.items() if k != "pass_"} | {"pass": spec["pass_"]}
    key = (spec["graph"], spec["device"])
    if ctx.get("graph_key") != key:
        ctx.pop("graph", None)
        ctx["graph_key"] = key
        try:
            ctx["graph"] = load_graph(spec["graph"], device)
        except Exception as err:  # data absent offline, or a generator failure: this case's row says so
            ctx["graph"] = err
    if isinstance(ctx["graph"], Exception):
        err = ctx["graph"]
        return [dict(meta, impl="relconv", status=f"unavailable: {type(err).__name__}: {err}"[:300])]
    g: Graph = ctx["graph"]
    meta.update(num_nodes=g.num_nodes, num_edges=int(g.edge_index.shape[1]), num_relations=g.num_relations)
    threads = thread_count(spec["threads"]) if "threads" in spec else None
    if threads is not None:
        meta["threads"] = threads

    elem = DTYPES[spec["dtype"]].itemsize
    e = g.edge_index.shape[1]
    bwd = spec["pass_"] == "fwd+bwd"
    if spec["kind"] == "layer":
        work = rgcn_layer_work(g.num_nodes, e, g.num_slots, g.num_relations, spec["C"], spec["C"], elem, bwd)
    else:
        w1 = rgcn_layer_work(g.num_nodes, e, g.num_slots, g.num_relations, HIDDEN, HIDDEN, elem, bwd)
        w2 = rgcn_layer_work(g.num_nodes, e, g.num_slots, g.num_relations, HIDDEN, g.num_classes, elem, bwd)
        work = (w1[0] + w2[0], w1[1] + w2[1])

    ref_layers = _source_layers(spec, g)
    impls = [("relconv", partial(_prepare, spec, g, device, "relconv", ref_layers))]
    for name in ("pyg", "pyg-fast", "dgl"):
        peer = "pyg" if name.startswith("pyg") else name
        if peer not in peers:
            continue
        if name == "dgl" and device.type != "cpu":
            continue
        ok, info = peers[peer]
        impls.append((name, partial(_prepare_or_missing, spec, g, device, name, ref_layers, ok, info)))
    use_dgl = "dgl" in peers and peers["dgl"][0]
    with _threads(threads, use_dgl):
        return run_case(meta, impls, device, timing, ceilings, work)


def _prepare_or_missing(spec, g, device, name, ref_layers, ok, info):
    if not ok:
        raise PeerMissing(info)
    return _prepare(spec, g, device, name, ref_layers)


PEERS = {"pyg": pyg_peer.available, "dgl": dgl_peer.available}
