// fp32 matmuls for MindSpore's CPU backend as `ops.Custom` "aot" kernels over OpenBLAS's cblas_sgemm
// (the scipy-openblas32 wheel: its symbols carry the prefix `scipy_`). Each entry point has MindSpore's
// aot signature: params = (a, b, c), all 2-D, row-major, fp32; c is written whole (beta = 0).
//   MatMulNN: c (M, N) = a (M, K) @ b (K, N)
//   MatMulNT: c (M, N) = a (M, K) @ b (N, K)^T   (a Linear: x W^T with W (out, in))
//   MatMulTN: c (M, N) = a (K, M)^T @ b (K, N)   (a weight's gradient: dY^T X)
// A nonzero return makes MindSpore raise: a wrong dtype, rank or inner size.
//
// Threads: OpenBLAS runs single-threaded (its own pool spin-waits, and on a busy machine a spinning thread whose
// partner is descheduled makes small products several times slower); a product of more than kMinSplitFlops is
// split into `g_threads` column (or row) blocks, each one sgemm on a thread of its own, joined before returning.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#include <cblas.h>

namespace {

int g_threads = 1;
constexpr double kMinSplitFlops = 4.0e6;

struct Gemm {
  CBLAS_TRANSPOSE ta, tb;
  int64_t m, n, k, lda, ldb;
  const float *a, *b;
  float *c;
};

// c[rows r0:r1, cols c0:c1] of the product, one single-threaded sgemm.
void Block(const Gemm &g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  if (r1 <= r0 || c1 <= c0) return;
  // row r of op(a): a + r*lda (N) or a + r (T); column j of op(b): b + j (N) or b + j*ldb (T)
  const float *a = g.a + (g.ta == CblasNoTrans ? r0 * g.lda : r0);
  const float *b = g.b + (g.tb == CblasNoTrans ? c0 : c0 * g.ldb);
  scipy_cblas_sgemm(CblasRowMajor, g.ta, g.tb, (blasint)(r1 - r0), (blasint)(c1 - c0), (blasint)g.k, 1.0f, a,
                    (blasint)g.lda, b, (blasint)g.ldb, 0.0f, g.c + r0 * g.n + c0, (blasint)g.n);
}

void Parallel(const Gemm &g) {
  const int parts = (2.0 * g.m * g.n * g.k < kMinSplitFlops) ? 1 : g_threads;
  if (parts <= 1) { Block(g, 0, g.m, 0, g.n); return; }
  const bool by_cols = g.n >= g.m;  // split the longer side of c
  const int64_t len = by_cols ? g.n : g.m;
  const int64_t step = ((len + parts - 1) / parts + 15) / 16 * 16;  // blocks of whole 16s: the kernels' widths
  std::vector<std::thread> workers;
  for (int64_t s = step; s < len; s += step) {
    const int64_t e = std::min(len, s + step);
    workers.emplace_back([&g, by_cols, s, e] { by_cols ? Block(g, 0, g.m, s, e) : Block(g, s, e, 0, g.n); });
  }
  const int64_t e0 = std::min(len, step);
  by_cols ? Block(g, 0, g.m, 0, e0) : Block(g, 0, e0, 0, g.n);
  for (auto &w : workers) w.join();
}

enum class Op { NN, NT, TN };

int Run(Op op, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam != 3) return 1;
  for (int i = 0; i < 3; ++i) {
    if (ndims[i] != 2 || std::strcmp(dtypes[i], "float32") != 0) return 2;
  }
  const int64_t a0 = shapes[0][0], a1 = shapes[0][1], b0 = shapes[1][0], b1 = shapes[1][1];
  const int64_t m = shapes[2][0], n = shapes[2][1];
  int64_t k;
  CBLAS_TRANSPOSE ta = CblasNoTrans, tb = CblasNoTrans;
  switch (op) {
    case Op::NN: k = a1; if (a0 != m || b0 != k || b1 != n) return 3; break;
    case Op::NT: k = a1; tb = CblasTrans; if (a0 != m || b1 != k || b0 != n) return 3; break;
    default: k = a0; ta = CblasTrans; if (a1 != m || b0 != k || b1 != n) return 3; break;
  }
  const float *a = static_cast<const float *>(params[0]);
  const float *b = static_cast<const float *>(params[1]);
  float *c = static_cast<float *>(params[2]);
  if (m == 0 || n == 0) return 0;
  if (k == 0) { std::memset(c, 0, sizeof(float) * m * n); return 0; }
  Parallel(Gemm{ta, tb, m, n, k, a1, b1, a, b, c});
  return 0;
}

}  // namespace

// The threads a product (or attention.cc's tasks) is split over.
int MindgrpoThreads() { return g_threads; }

extern "C" {

// The number of threads a product is split over (called once by the loader, from Python through ctypes).
void MindgrpoSetThreads(int n) {
  scipy_openblas_set_num_threads(1);
  g_threads = std::max(1, n);
}

int MatMulNN(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return Run(Op::NN, nparam, params, ndims, shapes, dtypes);
}
int MatMulNT(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return Run(Op::NT, nparam, params, ndims, shapes, dtypes);
}
int MatMulTN(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return Run(Op::TN, nparam, params, ndims, shapes, dtypes);
}

}  // extern "C"
