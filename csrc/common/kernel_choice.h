// Which CUDA kernel runs a relational convolution, and with which tiles: the one place this is
// decided. A pure function of the device (architecture, SM count, what the build compiled), the
// operand types, the layer's shape and the operands' alignment. The CUDA launchers
// (cuda/conv_launch.cuh, cuda/conv_launch_wgmma.cu) launch the configuration it names;
// relconv.ops.plan prints it through relconv._C.kernel_choice, in a CPU build too. Torch-free, so
// that both nvcc and the host compiler take it.
//
// Timings beside a threshold are kernel us on an H100 unless said otherwise, cached submanifold
// 3^3 layers over the voxel suite's scenes (64-beam scan 75k rows, real scan 28k, 32-beam 21k, 3
// sweeps 171k, 3.5M-voxel scene); `python -m benchmarks.run --suite voxel` reproduces the rows.
#pragma once

#include <cstdint>
#include <limits>

namespace relconv::choice {

enum class Dtype : int { kHalf = 0, kBFloat16 = 1, kFloat = 2, kDouble = 3 };

constexpr int element_bytes(Dtype d) { return d == Dtype::kDouble ? 8 : d == Dtype::kFloat ? 4 : 2; }
constexpr bool is_16bit(Dtype d) { return d == Dtype::kHalf || d == Dtype::kBFloat16; }

// One kernel configuration each; the launchers switch over these.
enum class Config : int {
  kNone = 0,  // no kernel of the table forward reads W^T as stored: the caller copies it
  // Hopper wgmma table forward (conv_forward_table_ws.cuh: persistent, warp-specialised;
  // conv_forward_table_wgmma.cuh: single-role), 128-row tiles.
  kWgmmaPersistent256,
  kWgmmaPersistent128,
  kWgmma256,
  kWgmma128,
  kWgmma64,
  // mma.sync table forward (conv_forward_table_mma), 128-byte K steps in 2 stages.
  kTableMmaTall64,
  kTableMmaPacked16,
  kTableMmaPacked16Tall,
  kTableMmaWide64,
  kTableMmaWide128,
  kTableMmaWide256,
  // mma.sync table forward, 64-byte K steps in 4 stages.
  kTableMmaTall96,
  kTableMmaWide96,
  kTableMma16,
  kTableMma32,
  kTableMma64,
  kTableMma128,
  // Exact fp32 table forward: the pipelined kernel with fmas on CUDA cores.
  kTableExact16,
  kTableExact32,
  // SIMT table forward (conv_forward_table_simt).
  kTableSimt32,
  kTableSimt64,
  kTableSimt128,
  // Pair-list forward with atomics (conv_forward.cuh, conv_forward_simt_vec.cuh).
  kPairsSimtVec128,
  kPairsSimtVec64,
  kPairsWmma32,
  kPairsWmma64,
  kPairsWmma128,
  kPairsSimt32,
  kPairsSimt64,
  kPairsSimt128,
  // Weight gradient (conv_weight_grad.cuh).
  kWeightGradMma16,
  kWeightGradMma32,
  kWeightGradMma64,
  kWeightGradMma128,
  kWeightGradExact16,
  kWeightGradExact32,
  kWeightGradExact64,
  kWeightGradExact128,
  kWeightGradSimt32,
  kWeightGradSimt64,
};

// A block's tile: BM x BN outputs, K steps of BK elements, WM x WN per warp (per thread for SIMT
// kernels), `stages` of software pipeline; `warps_k` warps share each warp tile's position, each
// summing its own slice of every K step (the weight gradient's 16 x 16 tile).
struct TileShape {
  int bm, bn, bk, wm, wn, stages, warps_k = 1;
};

// The tiles of `c` for elements of `bytes` bytes (tensor-core K steps count bytes, so fp32 in TF32
// mode gets the 16-bit layouts' stage sizes and load mappings).
constexpr TileShape tiles(Config c, int bytes) {
  const int wide_k = 128 / bytes, narrow_k = 64 / bytes;
  switch (c) {
    case Config::kWgmmaPersistent256: return {128, 256, 64, 0, 0, 4};
    case Config::kWgmmaPersistent128: return {128, 128, 64, 0, 0, 6};
    case Config::kWgmma256: return {128, 256, 64, 0, 0, 3};
    case Config::kWgmma128: return {128, 128, 64, 0, 0, 4};
    case Config::kWgmma64: return {128, 64, 64, 0, 0, 3};
    case Config::kTableMmaTall64: return {128, 64, wide_k, 32, 32, 2};
    case Config::kTableMmaWide64: return {64, 64, wide_k, 32, 32, 2};
    case Config::kTableMmaPacked16: return {64, 16, wide_k, 16, 16, 2};
    case Config::kTableMmaPacked16Tall: return {128, 16, wide_k, 64, 16, 2};
    case Config::kTableMmaTall96: return {128, 96, narrow_k, 32, 32, 4};
    case Config::kTableMmaWide96: return {64, 96, narrow_k, 32, 32, 4};
    case Config::kTableMmaWide128: return {128, 128, wide_k, 64, 32, 2};
    case Config::kTableMmaWide256: return {128, 128, wide_k, 32, 64, 2};
    case Config::kTableMma16: return {64, 16, narrow_k, 16, 16, 4};
    case Config::kTableMma32: return {64, 32, narrow_k, 32, 16, 4};
    case Config::kTableMma64: return {64, 64, narrow_k, 32, 32, 4};
    case Config::kTableMma128: return {64, 128, narrow_k, 32, 64, 4};
    case Config::kTableExact16: return {64, 16, narrow_k, 16, 16, 4};
    case Config::kTableExact32: return {64, 32, narrow_k, 32, 16, 4};
    case Config::kTableSimt32: return {64, 32, 16, 2, 4, 1};
    case Config::kTableSimt64: return {64, 64, 16, 4, 4, 1};
    case Config::kTableSimt128: return {64, 128, 16, 4, 8, 1};
    case Config::kPairsSimtVec128: return {128, 128, 0, 8, 8, 1};
    case Config::kPairsSimtVec64: return {128, 64, 0, 8, 8, 1};
    case Config::kPairsWmma32: return {128, 32, 32, 32, 32, 1};
    case Config::kPairsWmma64: return {64, 64, 32, 32, 32, 1};
    case Config::kPairsWmma128: return {64, 128, 32, 32, 64, 1};
    case Config::kPairsSimt32: return {128, 32, 16, 4, 4, 1};
    case Config::kPairsSimt64: return {64, 64, 16, 4, 4, 1};
    case Config::kPairsSimt128: return {64, 128, 16, 4, 8, 1};
    case Config::kWeightGradMma16: return {16, 16, wide_k, 16, 16, 4, 4};
    case Config::kWeightGradMma32: return {32, 32, narrow_k, 16, 16, 4};
    case Config::kWeightGradMma64: return {64, 64, narrow_k, 32, 32, 4};
    case Config::kWeightGradMma128: return {128, 128, narrow_k, 64, 32, 3};
    case Config::kWeightGradExact16: return {16, 16, wide_k, 16, 16, 4, 4};
    case Config::kWeightGradExact32: return {32, 32, narrow_k, 16, 32, 4};
    case Config::kWeightGradExact64: return {64, 64, narrow_k, 32, 32, 4};
    // 8-row K steps in 4 stages keep the fused fp32 tile within 128 registers (36 B of spill
    // against 412 B with 16-row steps): 3-8% less time at C128 on H200 (room-3cm stride 4: 466 -> 431 us).
    case Config::kWeightGradExact128: return {128, 128, 32 / bytes, 32, 64, 4};
    case Config::kWeightGradSimt32: return {32, 32, 16, 2, 2, 1};
    case Config::kWeightGradSimt64: return {64, 64, 16, 4, 4, 1};
    default: return {0, 0, 0, 0, 0, 0};
  }
}

// The configuration's name as relconv.ops.plan prints it.
constexpr const char* config_name(Config c) {
  switch (c) {
    case Config::kNone: return "none";
    case Config::kWgmmaPersistent256: return "wgmma_persistent_256";
    case Config::kWgmmaPersistent128: return "wgmma_persistent_128";
    case Config::kWgmma256: return "wgmma_256";
    case Config::kWgmma128: return "wgmma_128";
    case Config::kWgmma64: return "wgmma_64";
    case Config::kTableMmaTall64: return "table_mma_tall_64";
    case Config::kTableMmaWide64: return "table_mma_wide_64";
    case Config::kTableMmaTall96: return "table_mma_tall_96";
    case Config::kTableMmaWide96: return "table_mma_wide_96";
    case Config::kTableMmaWide128: return "table_mma_wide_128";
    case Config::kTableMmaWide256: return "table_mma_wide_256";
    case Config::kTableMma16: return "table_mma_16";
    case Config::kTableMmaPacked16: return "table_mma_packed_16";
    case Config::kTableMmaPacked16Tall: return "table_mma_packed_16_tall";
    case Config::kTableMma32: return "table_mma_32";
    case Config::kTableMma64: return "table_mma_64";
    case Config::kTableMma128: return "table_mma_128";
    case Config::kTableExact16: return "table_exact_16";
    case Config::kTableExact32: return "table_exact_32";
    case Config::kTableSimt32: return "table_simt_32";
    case Config::kTableSimt64: return "table_simt_64";
    case Config::kTableSimt128: return "table_simt_128";
    case Config::kPairsSimtVec128: return "pairs_simt_vec_128";
    case Config::kPairsSimtVec64: return "pairs_simt_vec_64";
    case Config::kPairsWmma32: return "pairs_wmma_32";
    case Config::kPairsWmma64: return "pairs_wmma_64";
    case Config::kPairsWmma128: return "pairs_wmma_128";
    case Config::kPairsSimt32: return "pairs_simt_32";
    case Config::kPairsSimt64: return "pairs_simt_64";
    case Config::kPairsSimt128: return "pairs_simt_128";
    case Config::kWeightGradMma16: return "weight_grad_mma_16";
    case Config::kWeightGradMma32: return "weight_grad_mma_32";
    case Config::kWeightGradMma64: return "weight_grad_mma_64";
    case Config::kWeightGradMma128: return "weight_grad_mma_128";
    case Config::kWeightGradExact16: return "weight_grad_exact_16";
    case Config::kWeightGradExact32: return "weight_grad_exact_32";
    case Config::kWeightGradExact64: return "weight_grad_exact_64";
    case Config::kWeightGradExact128: return "weight_grad_exact_128";
    case Config::kWeightGradSimt32: return "weight_grad_simt_32";
    case Config::kWeightGradSimt64: return "weight_grad_simt_64";
    default: return "unknown";
  }
}

constexpr const char* family_name(Config c) {
  switch (c) {
    case Config::kNone: return "none";
    case Config::kWgmmaPersistent256:
    case Config::kWgmmaPersistent128: return "table_wgmma_persistent";
    case Config::kWgmma256:
    case Config::kWgmma128:
    case Config::kWgmma64: return "table_wgmma";
    case Config::kTableMmaTall64:
    case Config::kTableMmaWide64:
    case Config::kTableMmaTall96:
    case Config::kTableMmaWide96:
    case Config::kTableMmaWide128:
    case Config::kTableMmaWide256:
    case Config::kTableMma16:
    case Config::kTableMmaPacked16:
    case Config::kTableMmaPacked16Tall:
    case Config::kTableMma32:
    case Config::kTableMma64:
    case Config::kTableMma128: return "table_mma_sync";
    case Config::kTableExact16:
    case Config::kTableExact32: return "table_exact_fp32";
    case Config::kTableSimt32:
    case Config::kTableSimt64:
    case Config::kTableSimt128: return "table_simt";
    case Config::kPairsSimtVec128:
    case Config::kPairsSimtVec64: return "pairs_simt_vec";
    case Config::kPairsWmma32:
    case Config::kPairsWmma64:
    case Config::kPairsWmma128: return "pairs_wmma";
    case Config::kPairsSimt32:
    case Config::kPairsSimt64:
    case Config::kPairsSimt128: return "pairs_simt";
    case Config::kWeightGradMma16:
    case Config::kWeightGradMma32:
    case Config::kWeightGradMma64:
    case Config::kWeightGradMma128: return "weight_grad_mma";
    case Config::kWeightGradExact16:
    case Config::kWeightGradExact32:
    case Config::kWeightGradExact64:
    case Config::kWeightGradExact128: return "weight_grad_exact_fp32";
    case Config::kWeightGradSimt32:
    case Config::kWeightGradSimt64: return "weight_grad_simt";
    default: return "unknown";
  }
}

// The device a kernel runs on.
struct Device {
  int major = 0, minor = 0;
  int64_t sms = 0;
};

// ---------------------------------------------------------------- relation split

// CTAs per row tile of a table kernel of `blocks` CTAs over `relations` relations (clusters need
// sm_90). Counted against SMs, not resident CTAs: CTAs sharing an SM do not add its throughput. Four
// when the split grid still fits the SMs once; two while the unsplit grid is about one wave or less,
// when its heaviest tiles set its length; none past that, where splitting only adds the reductions
// (measurements at relation_split_sum, cuda/conv_forward_table.cuh).
constexpr int relation_split(const Device& dev, int64_t blocks, int64_t relations) {
  if (dev.major < 9 || relations < 4) return 1;
  if (4 * blocks <= dev.sms) return 4;
  return 20 * blocks <= 21 * dev.sms ? 2 : 1;
}

// ---------------------------------------------------------------- forward over a neighbour table

struct TableProblem {
  Dtype dtype = Dtype::kFloat;
  bool allow_tf32 = false;   // torch.backends.cuda.matmul.allow_tf32
  bool index32 = true;       // the table is int32
  int64_t num_in = 0, num_out = 0, num_relations = 0, groups = 1, cin_g = 0, cout_g = 0;
  bool vec_x = false;        // x rows allow 16-byte loads
  bool vec_w = false;        // weight rows allow 16-byte loads (rows of C_in_g for W^T)
  bool vec_out2 = false;     // the output allows 2-element stores
  bool weight_t = false;     // the weight is W^T's storage (the input gradient's view)
  bool x_chunks = false;     // x rows start on C_in_g-element boundaries (relation packing)
};

struct TableChoice {
  Config config = Config::kNone;
  bool tf32 = false;            // fp32 on TF32 tensor cores
  bool whole_tiles = false;     // mma.sync: the whole-tile (kFull) kernel
  bool reads_weight_t = false;  // reads W^T as stored, no transposed copy
  int split = 1;                // CTAs per row tile (one cluster)
  int pack = 1;                 // mma.sync general kernel: relations per K step
};

// sm_90 (not 9.x), and this build compiled sm_90a: the wgmma kernels exist.
constexpr bool wgmma_device(const Device& dev) { return dev.major == 9 && dev.minor == 0; }

// Below this many output rows the single-role wgmma kernel beats mma.sync; from it on mma.sync's
// two CTAs per SM hide DRAM latency better (C128, 171k rows: wgmma 228 -> 265 us).
constexpr int64_t kWgmmaMaxRows = 100000;

// From this many rows C_out_g 64 on mma.sync takes 8-warp 128 x 64 tiles, reading each weight slab
// once per 128 rows (75k rows 47.8 -> 48.3 us, 171k 112.7 -> 101.7, 3.5M 2194 -> 1792). Its 32 x 32
// warp tiles in 2 stages beat the other tilings of the kernel on every scene family (H200, fp16,
// cached subm 3^3, kernel us, 128 x 64 w32x32 against the best other: 64-beam scan 46 / 46
// (w32x64), 4-scan batch 112 / 122, room-3cm 220 / 224, aggregate-1m 547 / 565, object-256 303 /
// 308, airborne 236 / 241; 3-4 stages, 32-wide K steps, 64- and 256-row tiles 4-45% slower):
// wider warp tiles read less shared memory per mma but leave 12 warps per SM instead of 24.
constexpr int64_t kTallTileRows = 100000;

// From this many output rows C16 -> 16 (16-bit) takes 128-row tiles; see tensor_core_table.
constexpr int64_t kPacked16TallRows = 600000;

// The Hopper wgmma kernels, when the shape takes them; kNone otherwise. `sm90a_built()` answers
// whether this build runs sm_90a code here (a probe kernel, asked only when the shape qualifies).
template <typename Sm90aBuilt>
TableChoice wgmma_table(const TableProblem& p, const Device& dev, Sm90aBuilt&& sm90a_built) {
  TableChoice c;
  const int64_t ldx = p.groups * p.cin_g;
  if (p.cin_g % 64 != 0 || p.cout_g % 64 != 0 || !p.vec_x || !p.vec_w || !p.vec_out2 ||
      ldx > std::numeric_limits<int32_t>::max() || p.cout_g / 64 * p.groups > 65535 || !wgmma_device(dev) ||
      !sm90a_built()) {
    return c;
  }
  // C_out_g 64: mma.sync with weight slabs through L1 (64 x 64 tiles) beats the single-role
  // kernel: 32-beam 25.4 -> 19.2 us, real scan 27.0 -> 25.4, 64-beam 38.8 -> 36.9. It beats the
  // persistent kernel with 128 x 64 tiles in 8 stages too, on sorted tables (H200, fp16, family
  // scenes: 64-beam 35 against 39 us, room-3cm 211 / 234, batch4-64beam 104 / 133, aggregate-1m
  // 536 / 630), and equals it on unsorted ones.
  if (p.cout_g == 64) return c;
  // Both wgmma kernels read a W^T view (the input gradient's weight) as stored.
  c.reads_weight_t = p.weight_t;
  if (p.cout_g % 128 == 0) {
    // Persistent kernel at C_out_g multiples of 128 wherever the split kernel would not split, at
    // any table size (against single-role / mma.sync: C128 64-beam 105.8 -> 65.6 us, 171k 198.0 ->
    // 152.4, 3.5M 4099 -> 3251; C256 64-beam 209.8 -> 151.8, 171k 658.4 -> 355.1). On the scene
    // families (H200, C128 fp16, against the best mma.sync tiling, 128 x 128 with 64 x 64 warp
    // tiles): 4-scan batch 216 / 259 us, room-3cm 439 / 571, aggregate-1m 1145 / 1437, object-256
    // 616 / 797, airborne 464 / 597, 64-beam scan 89 / 90 (whole calls, timed by CUDA events).
    const int64_t bn = p.cout_g % 256 == 0 ? 256 : 128;
    if (relation_split(dev, (p.num_out + 127) / 128 * (p.cout_g / bn) * p.groups, p.num_relations) == 1) {
      c.config = bn == 256 ? Config::kWgmmaPersistent256 : Config::kWgmmaPersistent128;
      return c;
    }
  }
  if (p.num_out >= kWgmmaMaxRows) return TableChoice{};
  // Single-role kernel, one wgmma in flight: C256 128 x 256 tiles in 3 stages (64-beam 346 -> 286
  // us against mma.sync), C128 128 x 128 in 4 (64-beam 131 -> 127).
  c.config = p.cout_g % 256 == 0 ? Config::kWgmma256 : p.cout_g % 128 == 0 ? Config::kWgmma128 : Config::kWgmma64;
  const TileShape t = tiles(c.config, element_bytes(p.dtype));
  c.split = relation_split(dev, (p.num_out + 127) / 128 * (p.cout_g / t.bn) * p.groups, p.num_relations);
  return c;
}

// An mma.sync configuration with its whole-tile and W^T decisions. The whole-tile kernel runs when
// x and W allow 16-byte loads and the channels fill whole tiles (C64 fp16 64-beam: 80 -> 56 us); it
// is built for int32 tables only and needs x's row stride below 2^31. Only it reads W^T in place
// (16-bit, not exact): otherwise a W^T view gets kNone, for the caller to copy it.
constexpr TableChoice table_mma(const TableProblem& p, const Device& dev, Config config, bool exact) {
  TableChoice c;
  const TileShape t = tiles(config, element_bytes(p.dtype));
  const int64_t ldx = p.groups * p.cin_g;
  const bool whole = p.index32 && p.vec_x && p.vec_w && p.vec_out2 && p.cin_g % t.bk == 0 && p.cout_g % t.bn == 0 &&
                     ldx <= std::numeric_limits<int32_t>::max();
  const bool in_place = whole && element_bytes(p.dtype) == 2 && !exact;
  if (p.weight_t && !in_place) return c;
  c.config = config;
  c.whole_tiles = whole;
  c.reads_weight_t = p.weight_t;
  // Stems (1-8 input channels): a K step holds several relations side by side instead of one
  // relation zero-padded to BK, when C_in_g elements are one 4-, 8- or 16-byte cp.async (H200,
  // cached maps, kernel us, room-3cm / batch of four 64-beam scans, one relation per step -> packed:
  // fp16 5^3 4 -> 32 2129 -> 360 / 981 -> 248; exact fp32 3^3 4 -> 32 297 -> 135 / 135 -> 80).
  // Tensor cores take 16-byte slots, one mma each, so the sum does not depend on which relations
  // share a step (the tile's rows, so table_order): 4-channel fp16 rows padded to 8 cost 5-19%
  // against 8-byte slots (H100, 4 -> 32, room-3cm 5^3 361 -> 431 us, 3^3 103 -> 120; 64-beam 3^3 22.6
  // -> 24.0). Exact fp32 takes C_in_g-wide slots: its fmas add in K order anyway. Three channels
  // (6-byte rows) stay one relation per step. 32-byte rows (C16 in 16-bit types) fill one whole mma
  // K block each, two relations to a 64-byte K step, where one relation padded to it left half of
  // every mma zero. The packed gather computes row offsets in 32 bits (x's row stride below 2^31).
  const int64_t row_bytes = p.cin_g * element_bytes(p.dtype);
  const int64_t slot = exact || row_bytes == 32 ? p.cin_g : 16 / element_bytes(p.dtype);
  if (!whole && p.x_chunks && (row_bytes == 4 || row_bytes == 8 || row_bytes == 16 || row_bytes == 32) &&
      t.bk % slot == 0 && t.bk > slot && ldx <= std::numeric_limits<int32_t>::max()) {
    c.pack = static_cast<int>(t.bk / slot);
  }
  c.split = relation_split(dev, (p.num_out + t.bm - 1) / t.bm * ((p.cout_g + t.bn - 1) / t.bn) * p.groups,
                           p.num_relations);
  return c;
}

// Tensor-core table forward (16-bit, or fp32 in TF32 mode).
template <typename Sm90aBuilt>
TableChoice tensor_core_table(const TableProblem& p, const Device& dev, Sm90aBuilt&& sm90a_built) {
  if (is_16bit(p.dtype) && p.index32 && p.cout_g >= 64) {
    const TableChoice w = wgmma_table(p, dev, sm90a_built);
    if (w.config != Config::kNone) return w;
  }
  // C_out_g 65-96 (Pointcept's SpUNet decoder, C96): 96-wide tiles of 32 x 32 warp tiles, 128
  // rows from kTallTileRows on, else 64, in 64-byte K steps, so that C_in_g 96, 128 and 160 (its
  // concatenated skips) fill whole tiles. 128-wide tiles left a quarter of every mma and B slab
  // padding, and C96 ran the general kernel (182 registers a thread: one CTA per SM); H200, cached
  // subm 3^3 fp16, kernel us, C96 -> 96: 64-beam scan 134 -> 61, room-3cm 1070 -> 468.
  // C_out_g 192 (a concatenated skip's layer: the input gradient of C192 -> 128) takes two of these
  // tiles, whole, where two 128-wide tiles computed 256 columns (H200, C192 -> 128 fp16 training
  // step, kernel us: batch4-64beam 2061 -> 1701, room-3cm 4997 -> 4136, aggregate-1m 13093 -> 10962).
  // C_out_g 160 does not gain: its second tile runs the general kernel either way (room-3cm 4367
  // against 4646 us for C160 -> 96).
  if ((p.cout_g > 64 && p.cout_g <= 96) || p.cout_g == 192) {
    return table_mma(p, dev, p.num_out >= kTallTileRows ? Config::kTableMmaTall96 : Config::kTableMmaWide96, false);
  }
  // C_in >= 64: 64-wide K steps (128 bytes) in 2 stages beat 3 stages, 32-wide steps and 128-row
  // tiles (C64 51 / 29 us against 55 / 32 in 3 stages, 64 / 40 in 128-row tiles, 64-beam / real),
  // where they fill whole tiles. A C_in_g that only 32-wide steps divide (96, 160: the input
  // gradient of a C96 layer) takes the 64-byte-step tiles below, whole, over the general kernel
  // (H200, C128 -> 96 fp16 training step, kernel us: room-3cm 3447 -> 2999, aggregate-1m 9026 -> 7993).
  const int64_t wide_k = 128 / element_bytes(p.dtype), narrow_k = wide_k / 2;
  const bool narrow_whole = p.cin_g % wide_k != 0 && p.cin_g % narrow_k == 0;
  if (p.cin_g >= 64 && p.cout_g > 32 && !narrow_whole) {
    if (p.cout_g <= 64 && p.num_out >= kTallTileRows) return table_mma(p, dev, Config::kTableMmaTall64, false);
    if (p.cout_g <= 64) return table_mma(p, dev, Config::kTableMmaWide64, false);
    // Past C_out 64, 8-warp 128 x 128 tiles: C128 64 x 32 warp tiles 119 / 63 us against 129 / 69
    // for 4-warp 64 x 128; C256 32 x 64 warp tiles 323 / 181 against 357 / 178 (64-beam / real).
    if (p.cout_g <= 128) return table_mma(p, dev, Config::kTableMmaWide128, false);
    return table_mma(p, dev, Config::kTableMmaWide256, false);
  }
  if (p.cout_g <= 16) {
    // 16- and 32-byte x rows (C_in_g 8 and 16 in 16-bit types) that pack (table_mma's rule) take
    // 128-byte K steps of 8 or 4 relations in 2 stages: fewer, fuller steps than 64-byte ones in 4
    // (H200, cached subm 3^3 fp16, kernel us, C16 -> 16: batch4-64beam 81 -> 78, room-3cm 130 -> 118,
    // aggregate-1m 347 -> 312; C8 -> 16 74 -> 75, 113 -> 103, 306 -> 281). 4 stages measured
    // slower. Narrower stem rows keep the 64-byte steps.
    // C16 rows from kPacked16TallRows on take 128-row tiles of two 64 x 16 warps, half the CTAs and
    // each warp four times the rows; below it 64-row tiles of four 16 x 16 warps hide more latency.
    // H200, cached subm 3^3 fp16 C16 -> 16, kernel us, 64 x 16 -> 128 x 16, forward / forward +
    // backward: batch4-64beam (273k rows) 50.4 -> 55.8 / 184 -> 196, room-3cm (310k) 96.4 -> 99.3 /
    // 339 -> 341, object-256 (469k) 133.8 -> 136.4 / 486 -> 464, aggregate-1m (937k) 279.7 -> 257.2 /
    // 926 -> 883, airborne-100m-25cm 100.4 -> 105.2 / 323 -> 342; 64 x 16 tiles of two 32 x 16 warps
    // came within 1.5% of four 16 x 16 everywhere.
    const int64_t row_bytes = p.cin_g * element_bytes(p.dtype);
    if (is_16bit(p.dtype) && row_bytes >= 16) {
      const bool tall = row_bytes == 32 && p.num_out >= kPacked16TallRows;
      const TableChoice packed =
          table_mma(p, dev, tall ? Config::kTableMmaPacked16Tall : Config::kTableMmaPacked16, false);
      if (packed.pack > 1) return packed;
    }
    return table_mma(p, dev, Config::kTableMma16, false);
  }
  if (p.cout_g <= 32) return table_mma(p, dev, Config::kTableMma32, false);
  if (p.cout_g <= 64) return table_mma(p, dev, Config::kTableMma64, false);
  return table_mma(p, dev, Config::kTableMma128, false);
}

// The table forward's kernel. Output rows are owned by one block each, so there is no atomic
// traffic to amortise with tall tiles: 64-row tiles give more blocks and a finer grain for skipping
// relations.
template <typename Sm90aBuilt>
TableChoice table_kernel(const TableProblem& p, const Device& dev, Sm90aBuilt&& sm90a_built) {
  if (p.weight_t && !is_16bit(p.dtype)) return TableChoice{};  // only 16-bit kernels read W^T in place
  const bool rows_fit = p.num_in <= std::numeric_limits<int32_t>::max();
  if (is_16bit(p.dtype)) return tensor_core_table(p, dev, sm90a_built);
  // fp32 runs on TF32 tensor cores when torch allows TF32 matmuls (sm_80+; the tensor-core kernel
  // keeps input rows as int32), like torch's own matmul; otherwise it stays exact.
  if (p.dtype == Dtype::kFloat && p.allow_tf32 && dev.major >= 8 && rows_fit) {
    TableChoice c = tensor_core_table(p, dev, sm90a_built);
    c.tf32 = true;
    return c;
  }
  if (p.dtype == Dtype::kFloat && p.cout_g <= 32 && rows_fit) {
    // Exact fp32 at C_out_g <= 32 on the pipelined kernel against fetch-on-demand (GPU us, 64-beam /
    // real): C16 33 / 22 against 48 / 20, C32 75 / 47 against 75 / 30; from C64 its per-thread tiles
    // lose (C64 193 against 168, C256 2552 against 2133), so wider layers keep the SIMT kernel.
    return table_mma(p, dev, p.cout_g <= 16 ? Config::kTableExact16 : Config::kTableExact32, true);
  }
  TableChoice c;
  c.config = p.cout_g <= 32 ? Config::kTableSimt32 : p.cout_g <= 64 ? Config::kTableSimt64 : Config::kTableSimt128;
  return c;
}

// ---------------------------------------------------------------- forward over pair lists

struct PairsProblem {
  Dtype dtype = Dtype::kFloat;
  int64_t groups = 1, cin_g = 0, cout_g = 0;
  bool vec_x = false, vec_w = false;
  bool out16 = false;  // the fp32 accumulator allows 16-byte rows (aligned, groups * C_out_g % 4 == 0)
};

// Pair tiles span as much of C_out as fits, so that each gathered row is reused across many
// columns; narrow outputs get taller pair tiles instead.
constexpr Config pairs_kernel(const PairsProblem& p) {
  if (p.dtype == Dtype::kFloat && p.cout_g >= 64 && p.vec_x && p.vec_w && p.out16) {
    // Exact fp32 from C_out 64 with 16-byte rows: 128-pair tiles, 8 x 8 float4 register tiles.
    return p.cout_g >= 128 ? Config::kPairsSimtVec128 : Config::kPairsSimtVec64;
  }
  if (is_16bit(p.dtype)) {
    // 4 warps each; warp tiles of 32x32 or 32x64 keep 4-8 accumulator fragments per warp.
    return p.cout_g <= 32 ? Config::kPairsWmma32 : p.cout_g <= 64 ? Config::kPairsWmma64 : Config::kPairsWmma128;
  }
  // 256 threads each, 16 or 32 accumulators per thread.
  return p.cout_g <= 32 ? Config::kPairsSimt32 : p.cout_g <= 64 ? Config::kPairsSimt64 : Config::kPairsSimt128;
}

// ---------------------------------------------------------------- weight gradient

struct WeightGradProblem {
  Dtype dtype = Dtype::kFloat;
  bool allow_tf32 = false;
  int64_t cin_g = 0, cout_g = 0;
  bool vec_x = false, vec_g = false;
  bool x_chunks = false;  // x rows start on C_in_g-element boundaries
};

// The pipelined kernel (16-byte rows, sm_80+: cp.async): square tiles as wide as the channels, 4
// warps (8 at C >= 128, whose 128 x 128 tile gathers each pair's rows once instead of twice), K steps
// of 64 bytes; mma.sync for 16-bit types and TF32, fmas for exact fp32 (8 x 8 per lane at C >= 128;
// against the SIMT kernel, H200, subm 3^3, kernel us: room-3cm C32 2126 -> 780, C64 2617 -> 1248,
// C128 10303 -> 3946; 64-beam scan C64 237 -> 125). Other rows, fp64 and older GPUs take the SIMT
// kernel. Stems' x rows of 4 or 8 bytes (1-4 channels) take it too, one cp.async per row. The
// pipelined kernel runs as one cooperative launch where one fits the GPU (cuda/conv_launch.cuh).
constexpr Config weight_grad_kernel(const WeightGradProblem& p, const Device& dev) {
  const int64_t x_row_bytes = p.cin_g * element_bytes(p.dtype);
  const bool x_rows = p.vec_x || (p.x_chunks && (x_row_bytes == 4 || x_row_bytes == 8));
  const bool pipelined = (is_16bit(p.dtype) || p.dtype == Dtype::kFloat) && x_rows && p.vec_g && dev.major >= 8;
  // Short x rows run on the 32 x 32 tiles at any C_out: their C_in (1-4) fills one tile row anyway.
  const bool narrow = (p.cin_g <= 32 && p.cout_g <= 32) || (pipelined && !p.vec_x),
             wide = p.cin_g >= 128 && p.cout_g >= 128;
  if (pipelined && (is_16bit(p.dtype) || p.allow_tf32)) {
    // Past 64 channels each way (C96 -> 96: 64 x 64 tiles cover 128 x 128 as four), the 128 x 128
    // tile does the same mma work and gathers each pair's rows once (H200, C96 -> 96 fp16, kernel
    // us: room-3cm 1599 -> 956, aggregate-1m 4210 -> 2462).
    const bool wide_mma = p.cin_g > 64 && p.cout_g > 64;
    // C16 and narrower (16-byte x rows) on a 16 x 16 tile whose four warps each take a quarter of
    // every 128-byte K step, where the 32 x 32 tile left three of its four warp tiles on padding
    // (H200, C16 fp16 weight gradient, kernel us: batch4-64beam 73 -> 47, room-3cm 194 -> 117,
    // aggregate-1m 507 -> 306; C8 -> 16 71 -> 43, 187 -> 109, 490 -> 282).
    if (p.vec_x && p.cin_g <= 16 && p.cout_g <= 16) return Config::kWeightGradMma16;
    return narrow ? Config::kWeightGradMma32 : wide_mma ? Config::kWeightGradMma128 : Config::kWeightGradMma64;
  }
  if (pipelined) {
    // C16 and narrower on the 16 x 16 tile, as for tensor cores: the 32 x 32 tile spends three
    // quarters of its fmas and half its copies on padding there.
    if (p.vec_x && p.cin_g <= 16 && p.cout_g <= 16) return Config::kWeightGradExact16;
    return narrow ? Config::kWeightGradExact32 : wide ? Config::kWeightGradExact128 : Config::kWeightGradExact64;
  }
  return narrow ? Config::kWeightGradSimt32 : Config::kWeightGradSimt64;
}

}  // namespace relconv::choice
