// c (M, N) = a (M, K) @ W (K, N) with W stored as panels: bp (P, K, 32), bp[p, k, j] = W[k, 32 p + j], N = 32 P.
// The rollout engine keeps its fused layer weights this way on the CPU (`kernels/panels.py`): a decode step's few
// rows meet the whole of W once per step, and a panel's K x 32 floats lie one after another, so they stream from
// memory at the rate the hardware prefetchers reach, where a row-major W is read 128 bytes a row, a row apart, and
// OpenBLAS or oneDNN first copy it into panels of their own (at a few rows that copy costs as much as the product).
//
// A panel takes up to kRows = 8 rows of a at a time: 8 x 2 accumulators of 16 floats stay in registers while k runs
// over K; each step of k loads the panel's 32 floats of row k once and multiplies them by 8 broadcast values of a.
// c[r, j] is the plain sum over k in order, one fused multiply-add each (exact to fp32 rounding like any order).
// The panels are dealt over the same threads as sgemm.cc's products (each thread a run of whole panels).
//
// AVX-512 only: PanelRows() says whether this CPU has it; `kernels/panels.py` keeps the row-major layout elsewhere.
//   PanelMatMul(a (M, K), bp (P, K, 32)) -> c (M, 32 P)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

int MindgrpoThreads();  // sgemm.cc: the threads a product is split over

namespace {

constexpr int kRows = 8;
constexpr int64_t kWidth = 32;
constexpr int64_t kAhead = 8;                 // rows of a panel prefetched ahead
constexpr double kMinSplitFlops = 4.0e6;      // as sgemm.cc: smaller products run on one thread
constexpr int64_t kBlockBytes = 512 * 1024;   // rows of a that pass over a panel together: ~a quarter of an L2

// c[0:R, 0:32] = a[0:R, 0:k] @ panel (k, 32); a's rows lda apart, c's ldc apart.
template <int R>
__attribute__((target("avx512f"))) void Tile(const float *a, int64_t lda, const float *panel, float *c, int64_t ldc,
                                             int64_t k) {
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const float *row = panel + i * kWidth;
    _mm_prefetch(reinterpret_cast<const char *>(row + kAhead * kWidth), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char *>(row + kAhead * kWidth + 16), _MM_HINT_T0);
    const __m512 b0 = _mm512_loadu_ps(row);
    const __m512 b1 = _mm512_loadu_ps(row + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + i]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
  }
}

using TileFn = void (*)(const float *, int64_t, const float *, float *, int64_t, int64_t);
constexpr TileFn kTiles[kRows + 1] = {nullptr, Tile<1>, Tile<2>, Tile<3>, Tile<4>, Tile<5>, Tile<6>, Tile<7>, Tile<8>};

// c[:, 32 p0 : 32 p1] for panels p0..p1 of bp. Rows of a go in blocks of about kBlockBytes (a few rows of a long K,
// more of a short one): each panel streams from memory once per block, and the block's rows pass over it while it
// is in the cache; a decode step's rows are one block.
void Panels(const float *a, const float *bp, float *c, int64_t m, int64_t k, int64_t n, int64_t p0, int64_t p1) {
  const int64_t block = std::max<int64_t>(kRows, kBlockBytes / (4 * k) / kRows * kRows);
  for (int64_t r0 = 0; r0 < m; r0 += block) {
    const int64_t r1 = std::min(m, r0 + block);
    for (int64_t p = p0; p < p1; ++p) {
      const float *panel = bp + p * k * kWidth;
      for (int64_t r = r0; r < r1; r += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
        kTiles[rows](a + r * k, k, panel, c + r * n + p * kWidth, n, k);
      }
    }
  }
}

}  // namespace

extern "C" {

// 1 when this CPU runs PanelMatMul (AVX-512), else 0 (called from Python through ctypes).
int MindgrpoPanels() { return __builtin_cpu_supports("avx512f") ? 1 : 0; }

// MindSpore's aot signature: params = (a, bp, c), fp32; c is written whole. A nonzero return makes MindSpore raise.
int PanelMatMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 3 || ndims[0] != 2 || ndims[1] != 3 || ndims[2] != 2) return 1;
  for (int i = 0; i < 3; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 2;
  }
  const int64_t m = shapes[0][0], k = shapes[0][1], panels = shapes[1][0], n = shapes[2][1];
  if (shapes[1][1] != k || shapes[1][2] != kWidth || shapes[2][0] != m || n != panels * kWidth) return 3;
  if (!MindgrpoPanels()) return 4;
  const float *a = static_cast<const float *>(params[0]);
  const float *bp = static_cast<const float *>(params[1]);
  float *c = static_cast<float *>(params[2]);
  if (m == 0 || n == 0) return 0;
  if (k == 0) { std::memset(c, 0, sizeof(float) * m * n); return 0; }
  const int64_t parts = (2.0 * m * n * k < kMinSplitFlops) ? 1 : std::min<int64_t>(MindgrpoThreads(), panels);
  const int64_t step = (panels + parts - 1) / parts;
  std::vector<std::thread> workers;
  for (int64_t s = step; s < panels; s += step) {
    const int64_t e = std::min(panels, s + step);
    workers.emplace_back([=] { Panels(a, bp, c, m, k, n, s, e); });
  }
  Panels(a, bp, c, m, k, n, 0, std::min(panels, step));
  for (auto &w : workers) w.join();
  return 0;
}

}  // extern "C"
