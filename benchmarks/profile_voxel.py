"""Where the GPU time of relconv's voxel path goes: per-kernel GPU time of cached layers, the
kernel-launch breakdown of one MinkUNet forward, and the sparsity of the neighbour table the
output-stationary kernel walks. A profiling aid (what to optimise), not a benchmark (what to claim).

    python -m benchmarks.profile_voxel [--workload scan64|FAMILY_SCENE] [--channels 32,64,128,256] [--peers]
                                       [--fresh] [--backward] [--only layer|minkunet|table]
                                       [--dtype fp16|bf16|tf32|fp32] [--stride S]

`--channels` takes widths C (a C -> C layer) or C_in:C_out pairs (`96,160:96`). `--backward` adds
the cached layer's training step (forward, then the backward of the output's sum), and MinkUNet's
fp16 training step (spconv's too with `--peers`). `--peers` adds
spconv / TorchSparse++ to the layer and MinkUNet breakdowns when importable (after `source
benchmarks/peers/activate.sh`). `--dtype` sets the layers' precision (fp32: exact, TF32 off) and
`--stride` takes the scene's sites at that tensor stride, the level after strided convs. Run
under `ncu --kernel-name regex:conv_forward_table --launch-count 1` for one kernel's hardware
counters.
"""

from __future__ import annotations

import argparse
import copy
from collections import defaultdict

import torch

from benchmarks.harness.floor import DTYPES
from benchmarks.harness.prepare import set_tf32
from benchmarks.workloads.voxels import at_stride, load_scene


def kernel_times(fn, repeats: int = 10) -> dict[str, tuple[int, float]]:
    """{kernel name: (launches per call, GPU µs per call)} over `repeats` calls after warm-up."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            a = acc[ev.name[:90]]
            a[0] += 1
            a[1] += ev.device_time
    return {k: (round(n / repeats), t / repeats) for k, (n, t) in acc.items()}


def print_breakdown(title: str, times: dict[str, tuple[int, float]], top: int = 25) -> None:
    total_n = sum(n for n, _ in times.values())
    total_t = sum(t for _, t in times.values())
    print(f"\n== {title}: {total_n} launches, {total_t:.1f} µs GPU per call")
    for name, (n, t) in sorted(times.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {t:9.1f} µs  {n:4d}x  {name}")


def host_breakdown(title: str, fn, top: int = 25) -> None:
    """Host (CPU) time of one call by op: where a host-bound forward spends its time."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    print(f"\n== {title}: host time by op (self CPU)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60))


def table_stats(scene, tile: int = 64) -> None:
    """Neighbour counts and how many (tile of `tile` outputs, relation) slots hold any neighbour: the
    work the output-stationary kernel cannot skip."""
    from relconv.voxel import VoxelTensor
    from relconv.voxel.kernel_map import layer_map

    x = VoxelTensor(torch.zeros(len(scene.coords), 1, device="cuda"), scene.coords)
    rmap = layer_map(x, (3, 3, 3), (1, 1, 1), (1, 1, 1)).rmap
    hit = rmap.neighbor_table() >= 0
    n, r = hit.shape
    pad = (-n) % tile
    print(f"\n== subm 3^3 table: {n} outputs, {hit.sum(1).float().mean().item():.2f} neighbours per output")
    for name, rows in (("natural order", hit), ("table_order", hit[rmap.table_order().long()])):
        tiles = torch.cat([rows, rows.new_zeros(pad, r)]).view(-1, tile, r)
        busy = tiles.any(1).float().mean().item()
        print(
            f"   {name}: {busy * 100:.1f}% of ({tile}-row tile, relation) slots busy -> "
            f"{hit.float().mean().item() / busy * 100:.1f}% of the rows computed are real"
        )
    order_op = torch.ops.relconv.neighbor_table_order
    print_breakdown("neighbor_table_order", kernel_times(lambda: order_op(rmap.neighbor_table())), top=8)


def _relconv_subm(coords, batch_size: int, cin: int, cout: int, dtype: torch.dtype):
    """{case: call} of a relconv subm 3^3 layer: the map cached or built in the call, and the
    training step over the cached map."""
    from relconv.voxel import Conv3d, VoxelTensor

    feats = torch.randn(len(coords), cin, device="cuda", dtype=dtype)
    conv = Conv3d(cin, cout, 3).cuda().to(dtype).eval()
    x = VoxelTensor(feats, coords)
    xg = VoxelTensor(feats.clone().requires_grad_(), coords)
    return {
        "cached": lambda: conv(x),
        "fresh": lambda: conv(VoxelTensor(feats, coords)),
        "cached fwd+bwd": lambda: conv(xg).feats.float().sum().backward(),
    }


def _spconv_subm(coords, batch_size: int, cin: int, cout: int, dtype: torch.dtype):
    """As _relconv_subm, for spconv (its indice_key cache holds the map)."""
    import spconv.pytorch as spconv

    from benchmarks.peers.spconv_peer import spatial_shape

    feats = torch.randn(len(coords), cin, device="cuda", dtype=dtype)
    coords, shape = coords.int(), spatial_shape(coords)
    sp = spconv.SubMConv3d(cin, cout, 3, padding=1, bias=False, indice_key="k").cuda().to(dtype).eval()

    def fresh(f=feats):
        return sp(spconv.SparseConvTensor(f, coords, shape, batch_size))

    st = spconv.SparseConvTensor(feats, coords, shape, batch_size)
    with torch.no_grad():
        st.indice_dict.update(fresh().indice_dict)
    # spconv's eval-mode convs run outside autograd and build maps without the backward's masks:
    # the training step takes a training-mode copy with a map of its own.
    train = copy.deepcopy(sp).train()
    stg = spconv.SparseConvTensor(feats.clone().requires_grad_(), coords, shape, batch_size)
    with torch.no_grad():
        built = train(spconv.SparseConvTensor(feats, coords, shape, batch_size))
    stg.indice_dict.update(built.indice_dict)
    return {
        "cached": lambda: sp(st),
        "fresh": fresh,
        "cached fwd+bwd": lambda: train(stg).features.float().sum().backward(),
    }


def layer_breakdown(
    scene,
    channels: list[tuple[int, int]],
    peers: bool,
    fresh: bool,
    backward: bool,
    dtype: str = "fp16",
    stride: int = 1,
) -> None:
    """Per-kernel GPU time of a subm 3^3 layer with its map cached and, with `fresh`, built in the
    call (a new coordinate set each call), with `backward` also its cached training step, for
    relconv and (`peers`) spconv; in `dtype` (DTYPES), over the scene's sites at tensor `stride`."""
    coords = at_stride(scene.coords, stride)
    set_tf32(dtype == "tf32")
    label = f"{dtype} stride {stride}" if stride > 1 else dtype
    cases = ("cached", "fresh") if fresh else ("cached",)
    libraries = [("relconv", _relconv_subm)]
    if peers:
        libraries.append(("spconv", _spconv_subm))
    for cin, cout in channels:
        width = f"C{cin}" if cin == cout else f"C{cin}->{cout}"
        for name, make in libraries:
            try:
                calls = make(coords, scene.batch_size, cin, cout, DTYPES[dtype])
            except ImportError as err:
                print(f"{name}: {err}")
                continue
            with torch.no_grad():
                for case in cases:
                    print_breakdown(f"{name} subm3 {width} {label} {case}", kernel_times(calls[case]), top=8)
            if backward:
                case = "cached fwd+bwd"
                print_breakdown(f"{name} subm3 {width} {label} {case}", kernel_times(calls[case]), top=8)


def parse_channels(text: str) -> list[tuple[int, int]]:
    """`--channels`: widths C or C_in:C_out pairs, comma-separated."""
    pairs = []
    for item in text.split(","):
        cin, _, cout = item.partition(":")
        pairs.append((int(cin), int(cout or cin)))
    return pairs


def minkunet_breakdown(scene, peers: bool, backward: bool) -> None:
    from relconv.voxel import VoxelTensor
    from relconv.voxel.models import MinkUNet

    model = MinkUNet(4, 19, width=1.0).cuda().eval()
    coords, feats = scene.coords, scene.feats

    def run():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.half):
            return model(VoxelTensor(feats, coords))

    print_breakdown("relconv MinkUNet1.0 fp16 infer", kernel_times(run), top=30)
    host_breakdown("relconv MinkUNet1.0 fp16 infer", run)
    if backward:
        _minkunet_training(model, lambda: VoxelTensor(feats, coords), "relconv")
    if peers:
        try:
            from benchmarks.peers import torchsparse as ts

            net = ts.TorchSparseMinkUNet(4, 19, 1.0).cuda().eval()
            grid = ts.spatial_range(coords, 1)
            f16 = feats.half()

            def run_ts():
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.half):
                    return net(ts.sparse_tensor(f16, coords, 1, grid))

            print_breakdown("TorchSparse++ SparseResUNet42 fp16 infer", kernel_times(run_ts), top=30)
        except ImportError as err:
            print("torchsparse:", err)
        if backward:
            try:
                from benchmarks.peers.minkunet import PeerMinkUNet, copy_weights
                from benchmarks.peers.spconv_peer import SpconvBackend

                be = SpconvBackend()
                peer = PeerMinkUNet(be, 4, 19, 1.0).cuda()
                copy_weights(model, peer)
                _minkunet_training(peer, lambda: be.tensor(feats, coords, scene.batch_size), "spconv")
            except ImportError as err:
                print("spconv:", err)


def _minkunet_training(model, make_input, name: str) -> None:
    """Kernel breakdown of one fp16 (autocast) training step of `model`: forward in train mode on
    `make_input()` (a new tensor, so the maps are built in the step), then the backward of the
    logits' sum."""
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.half):
            logits = model(make_input())
        logits.float().sum().backward()

    print_breakdown(f"{name} MinkUNet1.0 fp16 training step", kernel_times(step), top=30)
    model.eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="scan64")
    p.add_argument("--channels", default="32,64,128,256")
    p.add_argument("--peers", action="store_true")
    p.add_argument("--only", choices=("layer", "minkunet", "table"), default=None)
    p.add_argument("--fresh", action="store_true", help="also the layers with the map built in the call")
    p.add_argument(
        "--backward", action="store_true", help="also the cached layers' and MinkUNet's training step"
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16", help="the layers' precision")
    p.add_argument("--stride", type=int, default=1, help="the layers over the sites at this tensor stride")
    args = p.parse_args()
    if args.stride < 1:
        p.error(f"--stride must be at least 1, got {args.stride}")
    scene = load_scene(args.workload, torch.device("cuda"))
    print(torch.cuda.get_device_name(), args.workload, len(scene.coords), "voxels")
    if args.only in (None, "table"):
        table_stats(scene)
    if args.only in (None, "layer"):
        layer_breakdown(
            scene,
            parse_channels(args.channels),
            args.peers,
            args.fresh,
            args.backward,
            args.dtype,
            args.stride,
        )
    if args.only in (None, "minkunet"):
        minkunet_breakdown(scene, args.peers, args.backward)


if __name__ == "__main__":
    main()
