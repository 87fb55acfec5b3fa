#pragma once
// Cache-sized building blocks of the CPU relational conv: a tile of at most `rows` pairs of one
// relation is gathered into a thread-local buffer (converted to the accumulation type), multiplied by
// W[r] with a single-threaded BLAS call, and added into the output. Nothing of size P x C is ever
// materialised, so the working set of a thread stays in L1/L2 whatever the graph size.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <vector>

// The Fortran BLAS that torch links (MKL on x86 wheels, OpenBLAS elsewhere) exports these; ATen's own
// typed cpublas::gemm wrappers are not exported. Declared weak, so a torch build that hides them
// still loads, and falls back to ATen's matmul (about 5 us more per call, which the tiles amortise).
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc) __attribute__((weak));
int MKL_Set_Num_Threads_Local(int nt) __attribute__((weak));  // MKL's C API (lower case is Fortran)
}

namespace relconv {
namespace cpu {

// Inside a parallel loop each BLAS call must stay on its own thread. Torch turns MKL's dynamic
// threading off, so MKL would otherwise start its own team inside every loop thread (the
// oversubscription that made 2 threads slower than 1). Sets MKL's thread-local count for the scope.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : previous_(MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0) {}
  ~SingleThreadedBlas() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_;
};

// Column-major C[m, n] = op(A) op(B) + beta C (alpha = 1), single-threaded when called inside a
// parallel region (MKL and OpenBLAS do not nest threads). All sizes here are tile-sized (< 2^31).
template <typename acc_t>
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const acc_t* a, int64_t lda,
               const acc_t* b, int64_t ldb, acc_t beta, acc_t* c, int64_t ldc) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const int ila = static_cast<int>(lda), ilb = static_cast<int>(ldb), ilc = static_cast<int>(ldc);
  const acc_t one = 1;
  if constexpr (std::is_same_v<acc_t, float>) {
    if (sgemm_ != nullptr) return sgemm_(&ta, &tb, &im, &in, &ik, &one, a, &ila, b, &ilb, &beta, c, &ilc);
  } else {
    if (dgemm_ != nullptr) return dgemm_(&ta, &tb, &im, &in, &ik, &one, a, &ila, b, &ilb, &beta, c, &ilc);
  }
  // Row-major views: a column-major X with leading dimension ld is the row-major X^T, and
  // C = op(A) op(B) is the row-major C^T = op(B)^T op(A)^T.
  const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<acc_t>::value);
  auto rowmajor_t = [&](const acc_t* p, int64_t rows, int64_t cols, int64_t ld, bool trans) {
    // op(X)^T for column-major X that is rows x cols before op.
    at::Tensor xt = at::from_blob(const_cast<acc_t*>(p), {cols, rows}, {ld, 1}, opts);
    return trans ? xt.t() : xt;
  };
  const at::Tensor at_ = rowmajor_t(a, trans_a ? k : m, trans_a ? m : k, lda, trans_a);
  const at::Tensor bt = rowmajor_t(b, trans_b ? n : k, trans_b ? k : n, ldb, trans_b);
  at::Tensor ct = at::from_blob(c, {n, m}, {ldc, 1}, opts);
  if (beta == acc_t(0)) {
    ct.copy_(at::mm(bt, at_));
  } else {
    ct.addmm_(bt, at_);
  }
}

// Pairs per tile: the gathered rows and the products of one tile fill about 96 KiB (an L2 share),
// at least 16 rows so BLAS calls are not dominated by their fixed cost.
inline int64_t tile_rows(int64_t cin, int64_t cout, int64_t elem_size) {
  const int64_t per_row = std::max<int64_t>(1, (cin + cout) * elem_size);
  return std::clamp<int64_t>((int64_t{96} << 10) / per_row, 16, 512);
}

// dst[t, :] = src[idx[t], :] (converted to acc_t) for t < n.
template <typename scalar_t, typename acc_t, typename index_t>
void gather_rows(acc_t* dst, const scalar_t* src, int64_t c, const index_t* idx, const int64_t* pairs,
                 int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const scalar_t* s = src + static_cast<int64_t>(idx[pairs[t]]) * c;
    acc_t* d = dst + t * c;
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      std::memcpy(d, s, sizeof(acc_t) * c);
    } else {
      for (int64_t k = 0; k < c; ++k) d[k] = static_cast<acc_t>(s[k]);
    }
  }
}

// Row-major c[n, G*cout_g] (=|+=) a[n, G*cin_g] @ w[G, cin_g, cout_g], one BLAS call per group.
// BLAS is column-major, so the row-major product C = A W is computed as C^T = W^T A^T.
template <typename acc_t>
void grouped_gemm(acc_t* c, const acc_t* a, const acc_t* w, int64_t n, int64_t groups, int64_t cin_g,
                  int64_t cout_g) {
  const int64_t cin = groups * cin_g, cout = groups * cout_g;
  for (int64_t g = 0; g < groups; ++g) {
    blas_gemm<acc_t>(false, false, cout_g, n, cin_g, w + g * cin_g * cout_g, cout_g, a + g * cin_g, cin,
                     acc_t(0), c + g * cout_g, cout);
  }
}

// Row-major dw[G, cin_g, cout_g] (beta: 0 overwrite, 1 accumulate) += a[n, G*cin_g]^T @ b[n, G*cout_g].
template <typename acc_t>
void grouped_gemm_tn(acc_t* dw, const acc_t* a, const acc_t* b, int64_t n, int64_t groups, int64_t cin_g,
                     int64_t cout_g, acc_t beta) {
  const int64_t cin = groups * cin_g, cout = groups * cout_g;
  for (int64_t g = 0; g < groups; ++g) {
    // Column-major view: dw_g^T [cout_g, cin_g] = b_g^T [cout_g, n] @ a_g [n, cin_g].
    blas_gemm<acc_t>(false, true, cout_g, cin_g, n, b + g * cout_g, cout, a + g * cin_g, cin, beta,
                     dw + g * cin_g * cout_g, cout_g);
  }
}

// out[idx[pairs[t]], :] += scale[pairs[t]] * rows[t, :] for t < n, in order.
template <typename acc_t, typename index_t>
void scatter_add_rows(acc_t* out, const acc_t* rows, int64_t c, const index_t* idx, const acc_t* scale,
                      const int64_t* pairs, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = pairs[t];
    acc_t* d = out + static_cast<int64_t>(idx[p]) * c;
    const acc_t* s = rows + t * c;
    if (scale == nullptr) {
      for (int64_t k = 0; k < c; ++k) d[k] += s[k];
    } else {
      const acc_t f = scale[p];
      for (int64_t k = 0; k < c; ++k) d[k] += f * s[k];
    }
  }
}

// Multiplies each gathered row by its pair's scale (the weight gradient scales grad_out rows).
template <typename acc_t>
void scale_rows(acc_t* rows, int64_t c, const acc_t* scale, const int64_t* pairs, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const acc_t f = scale[pairs[t]];
    acc_t* r = rows + t * c;
    for (int64_t k = 0; k < c; ++k) r[k] *= f;
  }
}

}  // namespace cpu
}  // namespace relconv
