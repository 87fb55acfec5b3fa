#pragma once
// BatchNorm (+ReLU) over voxel features x [rows, channels] (row-major, contiguous), statistics per
// channel over all rows. Torch-free: the launchers are in batch_norm.cu.
//
// Thread mapping, shared by every kernel: the channels are cut into tiles (grid y) of `lanes`
// groups of V adjacent channels; a block of kBnThreads threads covers `rows_per_iter` = kBnThreads /
// lanes rows of its tile per step, thread t owning group t % lanes of row t / lanes. A thread keeps
// its channels for the whole kernel, so per-channel parameters are loaded once into registers and
// the row loop is pure streaming (V = 16 bytes of elements when C % V == 0 and the rows are aligned,
// else 1).
//
// Reductions (the training statistics, the backward's sum(g) and sum(g * (x - mean))) are
// deterministic: every thread sums its rows in a fixed order (batches of a few rows in the
// accumulation type, added to sums in double), the block sums its threads
// in a fixed order into one partial per channel (workspace, [2][blocks][C] in the accumulation type),
// and the partials are summed in two fixed-order levels: the last block of each group of
// `group_blocks` consecutive blocks of a tile to finish (an atomic ticket per group after a
// __threadfence) sums its group's partials into a group partial ([2][groups][C], after the block
// partials), and the last of those group sums of a tile (a ticket per tile) sums the group partials
// in double and finalises the channel. Two levels of about sqrt(blocks) rows each keep the serial
// tail, which one block runs while the rest of the GPU idles, to a few dependent L2 reads; one level
// over hundreds of partials took longer than the streaming pass itself. No float atomics, so two
// runs are bitwise equal. The tickets ([tiles] then [tiles][groups]) must be zero at launch, and are
// zero again when the kernel ends: a ticket counter wraps (atomicInc) as the last block draws it, so
// a ticket buffer cleared once serves every later launch on its stream (see stream_tickets in
// batch_norm.cu).
//
// The statistics are sums of (x - K) and (x - K)^2 with the shift K = x[0, c]: with K inside the
// data the sums do not cancel the way raw moments do (values of O(100) with unit variance), and the
// sums are carried in double up to the one subtraction var = E[(x-K)^2] - E[x-K]^2.
#include <cstdint>
#include <type_traits>

#include "cuda/numeric.cuh"

namespace relconv::cuda {

inline constexpr int kBnThreads = 256;
// Rows whose x and gradient a bn_backward_reduce thread loads before summing them.
inline constexpr int kBnBackwardRows = 2;

// Rows and the channel tiling (see the file comment); the same for every kernel of one call.
struct BnShape {
  int64_t rows;
  int channels;
  int lanes;               // V-channel groups per tile = threads per row
  int rows_per_iter;       // kBnThreads / lanes
  int64_t rows_per_block;  // reduction kernels: rows of one block's chunk (multiple of rows_per_iter)
  int group_blocks;        // reduction kernels: blocks of a tile whose partials one group sum takes
};

// Per-channel affine parameters and statistics. weight / bias may be null (1 and 0); the statistics
// are the batch ones (save_mean / save_invstd, accumulation type) when training, else the running
// ones (P) with invstd = 1 / sqrt(running_var + eps).
template <typename T, typename P>
struct BnParams {
  const P* weight;
  const P* bias;
  const P* running_mean;
  const P* running_var;
  const acc_t<T>* save_mean;
  const acc_t<T>* save_invstd;
  double eps;
  bool training;
};

template <typename T, int V>
struct alignas(sizeof(T) * V) BnVec {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ void bn_load(const T* p, acc_t<T> (&out)[V]) {
  const BnVec<T, V> r = *reinterpret_cast<const BnVec<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = to_acc(r.v[i]);
}

template <typename T, int V>
__device__ __forceinline__ void bn_store(T* p, const acc_t<T> (&in)[V]) {
  BnVec<T, V> r;
#pragma unroll
  for (int i = 0; i < V; ++i) r.v[i] = from_acc<T>(in[i]);
  *reinterpret_cast<BnVec<T, V>*>(p) = r;
}

template <typename P>
__device__ __forceinline__ P bn_from_double(double v) {
  return from_acc<P>(static_cast<acc_t<P>>(v));
}

// The thread's place in the tiling: its first channel, and its row offset inside a block step
// (-1 for the kBnThreads % lanes threads left over, and for lanes past the last channel).
struct BnThread {
  int c0;
  int row;
};

template <int V>
__device__ __forceinline__ BnThread bn_thread(const BnShape& s) {
  const int lane = static_cast<int>(threadIdx.x) % s.lanes;
  const int row = static_cast<int>(threadIdx.x) / s.lanes;
  const int c0 = (static_cast<int>(blockIdx.y) * s.lanes + lane) * V;
  return {c0, row < s.rows_per_iter && c0 < s.channels ? row : -1};
}

// The per-channel values a thread applies: y = (x - mean) * scale + beta, scale = invstd * gamma.
template <typename T, typename P, int V>
struct BnChannels {
  using A = acc_t<T>;
  A mean[V], invstd[V], gamma[V], beta[V];

  __device__ __forceinline__ void load(const BnParams<T, P>& p, int c0) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int c = c0 + i;
      if (p.training) {
        mean[i] = p.save_mean[c];
        invstd[i] = p.save_invstd[c];
      } else {
        mean[i] = to_acc(p.running_mean[c]);
        invstd[i] = A(1) / sqrt(static_cast<A>(to_acc(p.running_var[c])) + static_cast<A>(p.eps));
      }
      gamma[i] = p.weight ? static_cast<A>(to_acc(p.weight[c])) : A(1);
      beta[i] = p.bias ? static_cast<A>(to_acc(p.bias[c])) : A(0);
    }
  }

  // The forward's output before rounding to T (ReLU not applied).
  __device__ __forceinline__ A affine(int i, A x) const { return (x - mean[i]) * (invstd[i] * gamma[i]) + beta[i]; }
};

// Sums the `rows` x `cols` array at(r, col) over r per column, in an order fixed by (rows, cols),
// with all threads of the block: each column's rows are split into `slices` interleaved runs summed
// by one thread each, then the runs are added in slice order. emit(col, sum) runs on one thread per
// column. `scratch` holds kBnThreads doubles. Every thread of the block must call it.
template <typename At, typename Emit>
__device__ __forceinline__ void bn_column_sums(int64_t rows, int cols, double* scratch, At at, Emit emit) {
  const int slices = cols >= kBnThreads ? 1 : kBnThreads / cols;
  const int per_chunk = kBnThreads / slices;  // columns summed side by side
  const int t = static_cast<int>(threadIdx.x);
  for (int first = 0; first < cols; first += per_chunk) {
    const int col = first + t % per_chunk;
    const int slice = t / per_chunk;
    double acc = 0;
    if (col < cols && slice < slices) {
#pragma unroll 4
      for (int64_t r = slice; r < rows; r += slices) acc += at(r, col);
    }
    scratch[t] = acc;
    __syncthreads();
    if (t < per_chunk && col < cols) {
      double sum = 0;
      for (int k = 0; k < slices; ++k) sum += scratch[k * per_chunk + t];
      emit(col, sum);
    }
    __syncthreads();
  }
}

// Whether this block is the last of `arrivals` blocks to draw `ticket`, after publishing what it
// wrote; the last one then sees every other block's writes (read them with __ldcg).
__device__ __forceinline__ bool bn_last_arrival(unsigned* ticket, unsigned arrivals) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  // atomicInc stores 0 when it reads arrivals - 1: the last draw resets the ticket for the next launch.
  if (threadIdx.x == 0) last = atomicInc(ticket, arrivals - 1) == arrivals - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// The block's two per-channel sums (acc[0][i], acc[1][i] of every thread, V channels from c0) into
// partials[q][blockIdx.x][c], then the two-level sum of all blocks' partials of this channel tile
// (see the file comment) handed to finish(c, sum0, sum1) (one thread per channel, in the last block
// to finish). `partials` holds [2][gridDim.x][C] block partials then [2][groups][C] group partials;
// `smem` holds 2 * kBnThreads * V + kBnThreads doubles.
template <typename T, int V, typename Finish>
__device__ __forceinline__ void bn_reduce_and_finish(const BnShape& s, const BnThread& th, const double (&acc)[2][V],
                                                     acc_t<T>* partials, unsigned* tickets, double* smem,
                                                     Finish finish) {
  const int tile_c0 = static_cast<int>(blockIdx.y) * s.lanes * V;
  const int tile_width = min(s.lanes * V, s.channels - tile_c0);
  const int width = s.lanes * V;  // row stride of the per-thread values in smem
  double* values = smem;          // [2][rows_per_iter][width]
  double* scratch = smem + 2 * kBnThreads * V;
  if (th.row >= 0) {
    const int col0 = th.c0 - tile_c0;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
#pragma unroll
      for (int i = 0; i < V; ++i) values[(q * s.rows_per_iter + th.row) * width + col0 + i] = acc[q][i];
    }
  }
  __syncthreads();
  const int blocks = static_cast<int>(gridDim.x);
  // Rows `first`.. of a [2][rows][C] array of partials, this tile's columns (L2 reads: other blocks
  // wrote them, this SM's L1 may not be coherent with them).
  const auto column = [&](const acc_t<T>* array, int rows, int first) {
    return [=](int64_t r, int col) {
      const int q = col / tile_width, c = col % tile_width;
      return static_cast<double>(__ldcg(&array[(q * rows + first + r) * s.channels + tile_c0 + c]));
    };
  };
  const auto store = [&](acc_t<T>* array, int rows, int row) {
    return [=](int col, double sum) {
      const int q = col / tile_width, c = col % tile_width;
      array[(q * rows + row) * s.channels + tile_c0 + c] = static_cast<acc_t<T>>(sum);
    };
  };
  bn_column_sums(
      s.rows_per_iter, 2 * tile_width, scratch,
      [&](int64_t r, int col) {
        const int q = col / tile_width, c = col % tile_width;
        return values[(q * s.rows_per_iter + r) * width + c];
      },
      store(partials, blocks, blockIdx.x));

  const int groups = (blocks + s.group_blocks - 1) / s.group_blocks;
  const int group = static_cast<int>(blockIdx.x) / s.group_blocks;
  const int first = group * s.group_blocks;
  const int members = min(s.group_blocks, blocks - first);
  if (!bn_last_arrival(&tickets[gridDim.y + blockIdx.y * groups + group], members)) return;
  double* sums = smem;  // [2][tile_width]; the per-thread values are no longer needed
  if (groups == 1) {
    // Few blocks (batch_norm.cu's kOneLevelBlocks): their partials are summed at once.
    bn_column_sums(members, 2 * tile_width, scratch, column(partials, blocks, 0),
                   [&](int col, double sum) { sums[col] = sum; });
  } else {
    acc_t<T>* group_partials = partials + 2 * int64_t{blocks} * s.channels;
    bn_column_sums(members, 2 * tile_width, scratch, column(partials, blocks, first),
                   store(group_partials, groups, group));
    if (!bn_last_arrival(&tickets[blockIdx.y], groups)) return;
    bn_column_sums(groups, 2 * tile_width, scratch, column(group_partials, groups, 0),
                   [&](int col, double sum) { sums[col] = sum; });
  }
  __syncthreads();
  for (int c = threadIdx.x; c < tile_width; c += kBnThreads) finish(tile_c0 + c, sums[c], sums[tile_width + c]);
}

// Rows of this block's chunk in the reduction kernels: [begin, end).
__device__ __forceinline__ void bn_chunk(const BnShape& s, int64_t& begin, int64_t& end) {
  begin = static_cast<int64_t>(blockIdx.x) * s.rows_per_block;
  end = min(s.rows, begin + s.rows_per_block);
}

// ------------------------------------------------------------------ training forward: statistics

template <typename T, typename P>
struct BnStatsArgs {
  const T* x;
  acc_t<T>* partials;  // [2][gridDim.x][C]
  unsigned* tickets;   // [gridDim.y], zero at launch (and at exit)
  acc_t<T>* save_mean;
  acc_t<T>* save_invstd;
  P* running_mean;  // updated in place when not null
  P* running_var;
  int64_t* batch_counter;  // num_batches_tracked, incremented by one block; or nullptr
  double momentum;
  double eps;
};

// Batch mean and biased variance per channel -> save_mean, save_invstd; running statistics
// blended with momentum, the variance unbiased by n / (n - 1) (torch's semantics). Needs rows >= 2.
template <typename T, typename P, int V>
__global__ void __launch_bounds__(kBnThreads) bn_stats(BnShape s, BnStatsArgs<T, P> a) {
  __shared__ double smem[2 * kBnThreads * V + kBnThreads];
  // The module's batch counter rides on this launch (a separate add_ was one launch per layer).
  if (a.batch_counter != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) ++*a.batch_counter;
  const BnThread th = bn_thread<V>(s);
  double acc[2][V] = {};
  if (th.row >= 0) {
    acc_t<T> shift[V], v[4][V];
    bn_load<T, V>(a.x + th.c0, shift);
    int64_t begin, end;
    bn_chunk(s, begin, end);
    const int64_t step = s.rows_per_iter;
    int64_t r = begin + th.row;
    // Four rows in flight per thread: the loads are issued before the dependent sums.
    for (; r + 3 * step < end; r += 4 * step) {
#pragma unroll
      for (int k = 0; k < 4; ++k) bn_load<T, V>(a.x + (r + k * step) * s.channels + th.c0, v[k]);
      // The four rows summed in the accumulation type, then added to the double sums: a conversion
      // to double and a double add per element bound the pass on GPUs with few FP64 units.
#pragma unroll
      for (int i = 0; i < V; ++i) {
        acc_t<T> sum = 0, sum_sq = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const acc_t<T> d = v[k][i] - shift[i];
          sum += d;
          sum_sq += d * d;
        }
        acc[0][i] += static_cast<double>(sum);
        acc[1][i] += static_cast<double>(sum_sq);
      }
    }
    for (; r < end; r += step) {
      bn_load<T, V>(a.x + r * s.channels + th.c0, v[0]);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const double d = static_cast<double>(v[0][i]) - static_cast<double>(shift[i]);
        acc[0][i] += d;
        acc[1][i] += d * d;
      }
    }
  }
  bn_reduce_and_finish<T, V>(s, th, acc, a.partials, a.tickets, smem, [&](int c, double sum, double sum_sq) {
    const double n = static_cast<double>(s.rows);
    const double shift = static_cast<double>(to_acc(a.x[c]));
    const double shifted_mean = sum / n;
    const double mean = shift + shifted_mean;
    const double var = fmax(sum_sq / n - shifted_mean * shifted_mean, 0.0);
    a.save_mean[c] = static_cast<acc_t<T>>(mean);
    a.save_invstd[c] = static_cast<acc_t<T>>(1.0 / sqrt(var + a.eps));
    if (a.running_mean) {
      const double old = to_acc(a.running_mean[c]);
      a.running_mean[c] = bn_from_double<P>((1.0 - a.momentum) * old + a.momentum * mean);
    }
    if (a.running_var) {
      const double old = to_acc(a.running_var[c]);
      a.running_var[c] = bn_from_double<P>((1.0 - a.momentum) * old + a.momentum * var * n / (n - 1.0));
    }
  });
}

// ------------------------------------------------------------------ forward: apply

// y = relu?((x - mean) * invstd * gamma + beta), grid-stride over rows.
template <typename T, typename P, int V>
__global__ void __launch_bounds__(kBnThreads) bn_apply(BnShape s, const T* x, T* y, BnParams<T, P> p, bool relu) {
  const BnThread th = bn_thread<V>(s);
  if (th.row < 0) return;
  BnChannels<T, P, V> ch;
  ch.load(p, th.c0);
  const int64_t step = static_cast<int64_t>(gridDim.x) * s.rows_per_iter;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * s.rows_per_iter + th.row; r < s.rows; r += step) {
    acc_t<T> v[V];
    const int64_t off = r * s.channels + th.c0;
    bn_load<T, V>(x + off, v);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const acc_t<T> out = ch.affine(i, v[i]);
      v[i] = relu && !(out > acc_t<T>(0)) ? acc_t<T>(0) : out;
    }
    bn_store<T, V>(y + off, v);
  }
}

// ------------------------------------------------------------------ backward

// The incoming gradient times ReLU's derivative, read from the forward's output recomputed from x
// and rounded to T exactly as the forward stored it (the output is not saved).
template <typename T, typename P, int V>
__device__ __forceinline__ void bn_masked_grad(const BnChannels<T, P, V>& ch, const acc_t<T> (&x)[V], acc_t<T> (&g)[V],
                                               bool relu) {
  if (!relu) return;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const acc_t<T> out = to_acc(from_acc<T>(ch.affine(i, x[i])));
    if (!(out > acc_t<T>(0))) g[i] = acc_t<T>(0);
  }
}

template <typename T, typename P>
struct BnBackwardArgs {
  const T* grad_out;
  const T* x;
  T* grad_x;           // bn_backward_reduce: written here in eval mode when not null
  acc_t<T>* partials;  // [2][gridDim.x][C]
  unsigned* tickets;   // [gridDim.y], zero at launch (and at exit)
  P* grad_weight;      // [C] when not null
  P* grad_bias;        // [C] when not null
  acc_t<T>* coef;      // [2][C] when not null: sum(g) / n and sum(g * (x - mean)) * invstd^2 / n
};

// Per channel sum(g) and sum(g * (x - mean)) over the rows (g: the masked gradient) -> grad_bias =
// sum(g), grad_weight = invstd * sum(g * (x - mean)), and the two coefficients of the training input
// gradient (bn_backward_apply). In eval mode the input gradient gamma * invstd * g is written here
// too (a.grad_x), so an eval backward reads x and the gradient once.
template <typename T, typename P, int V>
__global__ void __launch_bounds__(kBnThreads)
    bn_backward_reduce(BnShape s, BnBackwardArgs<T, P> a, BnParams<T, P> p, bool relu) {
  using A = acc_t<T>;
  __shared__ double smem[2 * kBnThreads * V + kBnThreads];
  const BnThread th = bn_thread<V>(s);
  double acc[2][V] = {};
  if (th.row >= 0) {
    BnChannels<T, P, V> ch;
    ch.load(p, th.c0);
    int64_t begin, end;
    bn_chunk(s, begin, end);
    const int64_t step = s.rows_per_iter;
    A xv[kBnBackwardRows][V], g[kBnBackwardRows][V];
    // The first `count` loaded rows, first row r: their masked gradients summed in the accumulation
    // type and added to the double sums (as in bn_stats), and the eval input gradient written.
    const auto use = [&](auto rows, int64_t r) {
      constexpr int count = decltype(rows)::value;
#pragma unroll
      for (int k = 0; k < count; ++k) bn_masked_grad(ch, xv[k], g[k], relu);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        A sum_g = 0, sum_gx = 0;
#pragma unroll
        for (int k = 0; k < count; ++k) {
          sum_g += g[k][i];
          sum_gx += g[k][i] * (xv[k][i] - ch.mean[i]);
        }
        acc[0][i] += static_cast<double>(sum_g);
        acc[1][i] += static_cast<double>(sum_gx);
      }
      if (a.grad_x) {
#pragma unroll
        for (int k = 0; k < count; ++k) {
#pragma unroll
          for (int i = 0; i < V; ++i) g[k][i] *= ch.gamma[i] * ch.invstd[i];
          bn_store<T, V>(a.grad_x + (r + k * step) * s.channels + th.c0, g[k]);
        }
      }
    };
    int64_t r = begin + th.row;
    // kBnBackwardRows rows in flight per thread, as in bn_stats: the loads before the dependent sums.
    for (; r + (kBnBackwardRows - 1) * step < end; r += kBnBackwardRows * step) {
#pragma unroll
      for (int k = 0; k < kBnBackwardRows; ++k) {
        bn_load<T, V>(a.x + (r + k * step) * s.channels + th.c0, xv[k]);
        bn_load<T, V>(a.grad_out + (r + k * step) * s.channels + th.c0, g[k]);
      }
      use(std::integral_constant<int, kBnBackwardRows>{}, r);
    }
    for (; r < end; r += step) {
      bn_load<T, V>(a.x + r * s.channels + th.c0, xv[0]);
      bn_load<T, V>(a.grad_out + r * s.channels + th.c0, g[0]);
      use(std::integral_constant<int, 1>{}, r);
    }
  }
  bn_reduce_and_finish<T, V>(s, th, acc, a.partials, a.tickets, smem, [&](int c, double sum_g, double sum_gx) {
    const double invstd = p.training ? static_cast<double>(p.save_invstd[c])
                                     : 1.0 / sqrt(static_cast<double>(to_acc(p.running_var[c])) + p.eps);
    if (a.grad_bias) a.grad_bias[c] = bn_from_double<P>(sum_g);
    if (a.grad_weight) a.grad_weight[c] = bn_from_double<P>(sum_gx * invstd);
    if (a.coef) {
      const double n = static_cast<double>(s.rows);
      a.coef[c] = static_cast<A>(sum_g / n);
      a.coef[s.channels + c] = static_cast<A>(sum_gx * invstd * invstd / n);
    }
  });
}

// The training input gradient gamma * invstd * (g - sum(g) / n - (x - mean) * invstd^2 * sum(g * (x -
// mean)) / n) with the sums from bn_backward_reduce (coef); with coef == null (eval mode without a
// weight or bias gradient) gamma * invstd * g. Grid-stride over rows.
template <typename T, typename P, int V>
__global__ void __launch_bounds__(kBnThreads)
    bn_backward_apply(BnShape s, const T* grad_out, const T* x, T* grad_x, const acc_t<T>* coef, BnParams<T, P> p,
                      bool relu) {
  using A = acc_t<T>;
  const BnThread th = bn_thread<V>(s);
  if (th.row < 0) return;
  BnChannels<T, P, V> ch;
  ch.load(p, th.c0);
  A mean_g[V], proj[V], scale[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    mean_g[i] = coef ? coef[th.c0 + i] : A(0);
    proj[i] = coef ? coef[s.channels + th.c0 + i] : A(0);
    scale[i] = ch.gamma[i] * ch.invstd[i];
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * s.rows_per_iter;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * s.rows_per_iter + th.row; r < s.rows; r += step) {
    const int64_t off = r * s.channels + th.c0;
    A xv[V], g[V];
    bn_load<T, V>(x + off, xv);
    bn_load<T, V>(grad_out + off, g);
    bn_masked_grad(ch, xv, g, relu);
#pragma unroll
    for (int i = 0; i < V; ++i) g[i] = scale[i] * (g[i] - mean_g[i] - (xv[i] - ch.mean[i]) * proj[i]);
    bn_store<T, V>(grad_x + off, g);
  }
}

}  // namespace relconv::cuda
