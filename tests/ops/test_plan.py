"""The execution plan (relconv.ops.plan) and the CUDA kernel choice it reports
(csrc/common/kernel_choice.h through relconv._C.kernel_choice): the same function the CUDA
launchers call, asked on the CPU for given devices and shapes."""

from types import SimpleNamespace

import pytest
import torch

from relconv import _ext
from relconv.graph import RGCNConv
from relconv.graph.graph_map import build_rgcn_map
from relconv.ops import ConvPlan, Dataflow, plan, planning
from relconv.voxel import Conv3d, VoxelTensor

H100 = (9, 0)
A100 = (8, 0)


def choose(kind, dtype, arch=H100, sms=132, **shape):
    return _ext._C.kernel_choice(kind, dtype, arch, sms, **shape)


# (dtype, arch, C_in_g, C_out_g, rows, extra) -> the configuration the launchers launch, and the
# threshold or rule that decides it.
TABLE_CASES = [
    # C_out_g 64 stays on mma.sync (64 x 64 tiles, 2 stages of 64-wide K) below kTallTileRows ...
    ("float16", H100, 64, 64, 75_000, {}, "table_mma_wide_64"),
    # ... and takes 128 x 64 tiles from it on.
    ("float16", H100, 64, 64, 171_000, {}, "table_mma_tall_64"),
    # C_out_g 65-96: 96-wide tiles, 64 rows below kTallTileRows and 128 from it on (on sm_90a too,
    # where the wgmma kernels take multiples of 64 only).
    ("float16", H100, 96, 96, 75_000, {}, "table_mma_wide_96"),
    ("bfloat16", H100, 160, 96, 273_000, {}, "table_mma_tall_96"),
    ("float32", A100, 64, 80, 75_000, {"allow_tf32": True}, "table_mma_wide_96"),
    # C_out_g 192 (the input gradient of a concatenated skip's layer): two whole 96-wide tiles; the
    # wgmma kernels keep multiples of 64 below 100k rows. C_out_g 160 stays on 128-wide tiles.
    ("float16", H100, 128, 192, 273_000, {}, "table_mma_tall_96"),
    ("float16", H100, 128, 192, 75_000, {}, "wgmma_64"),
    ("float16", H100, 96, 160, 273_000, {}, "table_mma_128"),
    # C_in_g 96 (the input gradient of a C96 layer): 32-wide K steps, whose tiles it fills.
    ("float16", H100, 96, 128, 273_000, {}, "table_mma_128"),
    ("float16", H100, 96, 64, 273_000, {}, "table_mma_64"),
    # C_out_g multiples of 128 on sm_90a: the persistent wgmma kernel where no relation split pays.
    ("float16", H100, 128, 128, 75_000, {}, "wgmma_persistent_128"),
    ("bfloat16", H100, 256, 256, 20_000, {}, "wgmma_persistent_256"),
    # A small table splits its relations over a cluster: the single-role wgmma kernel.
    ("float16", H100, 128, 128, 1_000, {}, "wgmma_128"),
    # A build without sm_90a code, or an sm_80 GPU: mma.sync's 8-warp 128 x 128 tiles.
    ("float16", H100, 128, 128, 75_000, {"sm90a_built": False}, "table_mma_wide_128"),
    ("float16", A100, 256, 256, 75_000, {}, "table_mma_wide_256"),
    # Narrow layers: 64-row tiles of 32-wide K steps in 4 stages.
    ("float16", H100, 16, 16, 75_000, {}, "table_mma_packed_16"),
    # C16 from kPacked16TallRows on: 128-row tiles; C8 rows keep 64-row ones.
    ("float16", H100, 16, 16, 599_999, {}, "table_mma_packed_16"),
    ("bfloat16", H100, 16, 16, 600_000, {}, "table_mma_packed_16_tall"),
    ("float16", H100, 8, 16, 937_000, {}, "table_mma_packed_16"),
    ("float16", H100, 4, 16, 75_000, {}, "table_mma_16"),
    ("float16", H100, 16, 16, 75_000, {"x_chunks": False}, "table_mma_16"),
    ("float16", H100, 32, 64, 75_000, {}, "table_mma_64"),
    # Exact fp32 up to C_out_g 32 on the pipelined CUDA-core kernel, wider on the SIMT kernel.
    ("float32", H100, 32, 32, 75_000, {}, "table_exact_32"),
    ("float32", H100, 64, 64, 75_000, {}, "table_simt_64"),
    # fp32 in TF32 mode takes the tensor-core tiles, K steps counted in bytes.
    ("float32", A100, 64, 64, 75_000, {"allow_tf32": True}, "table_mma_wide_64"),
    ("float64", H100, 128, 128, 75_000, {}, "table_simt_128"),
]


@pytest.mark.parametrize(("dtype", "arch", "cin", "cout", "rows", "extra", "expected"), TABLE_CASES)
def test_table_kernel_choice_matches_the_launchers_rules(dtype, arch, cin, cout, rows, extra, expected):
    got = choose(
        "table", dtype, arch, cin_g=cin, cout_g=cout, num_in=rows, num_out=rows, num_relations=27, **extra
    )
    assert got["config"] == expected


def test_table_choice_details():
    tall = choose("table", "float16", cin_g=64, cout_g=64, num_in=171_000, num_out=171_000, num_relations=27)
    assert (
        tall["family"] == "table_mma_sync"
        and tall["tiles"] == (128, 64, 64, 32, 32, 2)
        and tall["whole_tiles"]
    )
    # C16 (and C8) rows pack 4 (8) relations into each 128-byte K step of the 16-column tile.
    for cin, pack in ((16, 4), (8, 8)):
        c16 = choose(
            "table", "float16", cin_g=cin, cout_g=16, num_in=75_000, num_out=75_000, num_relations=27
        )
        assert c16["pack"] == pack and c16["tiles"] == (64, 16, 64, 16, 16, 2) and not c16["whole_tiles"]
    tall16 = choose(
        "table", "float16", cin_g=16, cout_g=16, num_in=937_000, num_out=937_000, num_relations=27
    )
    assert tall16["pack"] == 4 and tall16["tiles"] == (128, 16, 64, 64, 16, 2)
    c96 = choose("table", "float16", cin_g=96, cout_g=96, num_in=273_000, num_out=273_000, num_relations=27)
    assert c96["tiles"] == (128, 96, 32, 32, 32, 4) and c96["whole_tiles"]
    # 32-wide K steps: C_in_g 160 (a concatenated skip) fills whole tiles too, C_out_g 80 does not.
    c160 = choose("table", "float16", cin_g=160, cout_g=96, num_in=75_000, num_out=75_000, num_relations=27)
    assert c160["tiles"] == (64, 96, 32, 32, 32, 4) and c160["whole_tiles"]
    c80 = choose("table", "float16", cin_g=64, cout_g=80, num_in=75_000, num_out=75_000, num_relations=27)
    assert c80["config"] == "table_mma_wide_96" and not c80["whole_tiles"]
    dgrad = choose("table", "float16", cin_g=96, cout_g=128, num_in=75_000, num_out=75_000, num_relations=27)
    assert dgrad["whole_tiles"] and dgrad["tiles"][2] == 32
    small = choose("table", "float16", cin_g=128, cout_g=128, num_in=1000, num_out=1000, num_relations=27)
    assert small["split"] == 4  # 8 row tiles on 132 SMs: four CTAs per tile in one cluster
    tf32 = choose(
        "table", "float32", A100, cin_g=64, cout_g=64, num_out=1000, allow_tf32=True, num_relations=27
    )
    assert tf32["tf32"] and tf32["tiles"][2] == 32  # 128-byte K steps of fp32
    exact = choose("table", "float32", A100, cin_g=64, cout_g=64, num_out=1000, num_relations=27)
    assert not exact["tf32"]


@pytest.mark.parametrize(
    ("dtype", "cin", "extra", "pack"),
    [
        ("float16", 4, {}, 4),  # 8-byte rows in 16-byte slots of 32-wide K steps
        ("bfloat16", 2, {}, 4),  # 4-byte rows
        ("float16", 8, {}, 4),  # 16-byte rows
        ("float32", 4, {}, 4),  # exact fp32: 16-wide K steps, slots of C_in
        ("float32", 2, {}, 8),
        ("float32", 1, {"allow_tf32": True}, 4),  # TF32: 4-element slots
        ("float16", 3, {}, 1),  # 6-byte rows: no cp.async of that size
        ("float16", 4, {"x_chunks": False}, 1),  # x not aligned to its rows
        ("float16", 32, {}, 1),  # one relation fills the K step
        ("float16", 16, {}, 2),  # 32-byte rows: one whole mma K block per relation
        ("bfloat16", 16, {}, 2),
        ("float32", 8, {"allow_tf32": True}, 2),
        ("float32", 8, {}, 2),
        ("float16", 16, {"x_chunks": False}, 1),
    ],
)
def test_small_input_channels_pack_relations_into_a_k_step(dtype, cin, extra, pack):
    got = choose(
        "table", dtype, cin_g=cin, cout_g=32, num_in=75_000, num_out=75_000, num_relations=125, **extra
    )
    assert got["family"] in ("table_mma_sync", "table_exact_fp32") and got["pack"] == pack
    element_bytes = 4 if dtype == "float32" else 2
    exact = got["family"] == "table_exact_fp32"
    slot = cin if exact or cin * element_bytes == 32 else 16 // element_bytes
    assert pack == 1 or got["tiles"][2] == pack * slot


def test_transposed_weight_is_read_in_place_only_by_whole_tile_16bit_kernels():
    """The input gradient's W^T view: the whole-tile mma.sync kernel reads it as stored; a shape
    without whole tiles gets no kernel ("none"), and the launcher copies W^T."""
    args = {"cin_g": 64, "cout_g": 64, "num_in": 75_000, "num_out": 75_000, "num_relations": 27}
    in_place = choose("table", "float16", weight_t=True, **args)
    assert in_place["config"] == "table_mma_wide_64" and in_place["reads_weight_t"]
    assert choose("table", "float16", weight_t=True, vec_w=False, **args)["config"] == "none"
    assert choose("table", "float32", weight_t=True, **args)["config"] == "none"
    # The wgmma kernels read it too.
    wide = choose("table", "float16", weight_t=True, **{**args, "cin_g": 128, "cout_g": 128})
    assert wide["config"] == "wgmma_persistent_128" and wide["reads_weight_t"]


@pytest.mark.parametrize(
    ("dtype", "cout", "extra", "expected"),
    [
        ("float32", 64, {}, "pairs_simt_vec_64"),
        ("float32", 128, {}, "pairs_simt_vec_128"),
        ("float32", 128, {"out16": False}, "pairs_simt_128"),
        ("float16", 32, {}, "pairs_wmma_32"),
        ("bfloat16", 96, {}, "pairs_wmma_128"),
        ("float64", 48, {}, "pairs_simt_64"),
    ],
)
def test_pairs_kernel_choice(dtype, cout, extra, expected):
    assert choose("pairs", dtype, cin_g=cout, cout_g=cout, **extra)["config"] == expected


@pytest.mark.parametrize(
    ("dtype", "arch", "cin", "cout", "extra", "expected"),
    [
        ("float16", H100, 32, 32, {}, "weight_grad_mma_32"),
        # C16: a 16 x 16 tile whose four warps split each K step.
        ("float16", H100, 16, 16, {}, "weight_grad_mma_16"),
        ("bfloat16", H100, 8, 16, {}, "weight_grad_mma_16"),
        ("float32", H100, 16, 16, {"allow_tf32": True}, "weight_grad_mma_16"),
        ("float32", H100, 16, 16, {}, "weight_grad_exact_16"),
        ("float32", H100, 8, 16, {}, "weight_grad_exact_16"),
        ("float16", H100, 16, 32, {}, "weight_grad_mma_32"),
        ("float16", H100, 64, 128, {}, "weight_grad_mma_64"),
        ("bfloat16", H100, 128, 128, {}, "weight_grad_mma_128"),
        ("float16", H100, 96, 96, {}, "weight_grad_mma_128"),
        ("float32", H100, 16, 32, {}, "weight_grad_exact_32"),
        ("float32", H100, 64, 64, {}, "weight_grad_exact_64"),
        ("float32", H100, 128, 256, {}, "weight_grad_exact_128"),
        ("float32", H100, 64, 64, {"vec_x": False}, "weight_grad_simt_64"),
        # Stems: x rows of 8 or 4 bytes that start on their size take the pipelined kernel.
        ("float16", H100, 4, 32, {"vec_x": False}, "weight_grad_mma_32"),
        ("bfloat16", H100, 2, 16, {"vec_x": False}, "weight_grad_mma_32"),
        ("float32", H100, 1, 32, {"vec_x": False}, "weight_grad_exact_32"),
        ("float32", H100, 2, 64, {"vec_x": False}, "weight_grad_exact_32"),
        ("float16", H100, 3, 32, {"vec_x": False}, "weight_grad_simt_32"),  # 6-byte rows
        ("float16", H100, 4, 32, {"vec_x": False, "x_chunks": False}, "weight_grad_simt_32"),
        ("float32", (7, 5), 64, 64, {}, "weight_grad_simt_64"),
        ("float32", H100, 64, 64, {"allow_tf32": True}, "weight_grad_mma_64"),
        ("float16", (7, 5), 64, 64, {}, "weight_grad_simt_64"),
        ("float64", H100, 16, 16, {}, "weight_grad_simt_32"),
    ],
)
def test_weight_grad_kernel_choice(dtype, arch, cin, cout, extra, expected):
    assert choose("weight_grad", dtype, arch, cin_g=cin, cout_g=cout, **extra)["config"] == expected


def test_kernel_choice_rejects_unknown_arguments():
    with pytest.raises(ValueError, match="kind"):
        choose("conv", "float16", cin_g=8, cout_g=8)
    with pytest.raises(ValueError, match="dtype"):
        choose("table", "int8", cin_g=8, cout_g=8)


def _voxel_layer(channels=64):
    g = torch.Generator().manual_seed(3)
    coords = torch.unique(
        torch.randint(0, 8, (300, 4), generator=g) % torch.tensor([2, 8, 8, 8]), dim=0
    ).int()
    x = VoxelTensor(torch.randn(len(coords), channels, generator=g).half(), coords)
    conv = Conv3d(channels, channels, 3).half()
    return x, conv


def test_voxel_layer_plan_says_what_runs():
    x, conv = _voxel_layer()
    cpu = conv.execution_plan(x)
    assert isinstance(cpu, ConvPlan) and cpu.kernel == "cpu kernel"
    with torch.no_grad():
        h100 = conv.execution_plan(x, arch=H100)
    assert h100.dataflow is Dataflow.OUTPUT_STATIONARY
    assert "fp16 + unique-slot map" in repr(h100)
    assert h100.kernel.startswith("table_mma_sync (table_mma_wide_64")
    assert h100.views[0] == "table" and h100.input_grad is None
    trained = conv.execution_plan(x, arch=H100, requires_grad=True)
    # A voxel map is injective: the input gradient runs the table kernel over the transposed
    # table, reading W^T in place; the weight gradient reads the pairs.
    assert "transposed table" in trained.views and "pairs for backward" in trained.views
    assert "over the transposed table" in trained.input_grad and "reads W^T in place" in trained.input_grad
    assert trained.weight_grad.startswith("weight_grad_mma")


def test_plan_states_the_sort_rule_of_its_dtype():
    """Exact fp32 work counts EXACT_SORT_WEIGHT times towards the table sort; fp16's and TF32's once."""
    from relconv.ops import map_views
    from tests.conftest import allow_tf32

    x, conv = _voxel_layer(channels=32)  # exact fp32 takes the table up to 32 output channels
    with torch.no_grad():
        assert conv.execution_plan(x, arch=H100).sort.endswith("multiply-adds")
        conv32, x32 = conv.float(), x.replace_feature(x.feats.float())
        with allow_tf32(False):
            exact = conv32.execution_plan(x32, arch=H100)
        with allow_tf32(True):
            tf32 = conv32.execution_plan(x32, arch=H100)
    assert exact.sort.endswith(f"each counting {map_views.EXACT_SORT_WEIGHT:g}x")
    assert tf32.sort.endswith("multiply-adds")


def test_graph_layer_plan_says_what_runs():
    torch.manual_seed(0)
    edge_index = torch.randint(0, 50, (2, 400))
    edge_type = torch.randint(0, 4, (400,))
    layer = RGCNConv(32, 32, num_relations=4)
    x = torch.randn(50, 32)
    got = layer.execution_plan(x, edge_index, edge_type, arch=H100)
    # Mean aggregation scales every pair: the pair lists with atomics, whatever the dtype.
    assert got.dataflow is Dataflow.FETCH_ON_DEMAND and "per-pair scale" in got.why
    assert got.kernel.startswith("pairs_simt") and got.views == ("pairs",)
    assert "cpu kernel" in repr(layer.execution_plan(x, edge_index, edge_type))


def test_plan_agrees_with_the_call_it_describes():
    """The printed plan and the call's own decision come from the same rule."""
    from relconv.ops.planning import decide

    rmap = build_rgcn_map(torch.randint(0, 20, (2, 80)), torch.randint(0, 3, (80,)), (20, 20), 3, "sum").rmap
    x, w = torch.randn(20, 8), torch.randn(3, 8, 8)
    with pytest.raises(ValueError, match="unique_slots"):
        plan(rmap, x, w, dataflow=Dataflow.OUTPUT_STATIONARY)
    p = plan(rmap, x, w, arch=H100)
    _, table, _, _ = decide(rmap, x, Dataflow.AUTO, 8, 8, False, False)
    assert not table and p.dataflow is Dataflow.FETCH_ON_DEMAND


@pytest.mark.parametrize(
    "arch, dtype, cin, cout, transposed, expected",
    [
        (H100, torch.float16, 64, 128, False, True),  # the forward's C_out 128
        (H100, torch.bfloat16, 256, 256, True, True),
        (H100, torch.float16, 64, 64, True, False),  # mma.sync both ways
        (H100, torch.float16, 128, 64, False, False),
        (H100, torch.float16, 128, 64, True, True),  # the input gradient's C_out 128 (W^T in place)
        (A100, torch.float16, 64, 128, True, False),
        (H100, torch.float32, 64, 128, True, False),  # exact fp32
    ],
)
def test_persistent_table_kernel_names_the_calls_prepare_copies_no_tables_for(
    monkeypatch, arch, dtype, cin, cout, transposed, expected
):
    """relconv.ops.prepare copies no tables in order for the persistent warp-specialised kernel:
    planning.persistent_table_kernel asks kernel_choice for the forward and the input gradient."""
    monkeypatch.setattr(planning, "_device_shape", lambda device: (arch, 132))
    rmap = SimpleNamespace(num_in=75_000, num_out=75_000, num_relations=27, index_dtype=torch.int32)
    x = torch.empty(0, cin, dtype=dtype)
    weight = torch.empty(27, cin, cout, dtype=dtype)
    assert planning.persistent_table_kernel(rmap, x, weight, transposed) == expected
