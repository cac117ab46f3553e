// Probe (not a benchmark): how fast can c (M, N) = x (M, K) @ W (K, N) run at a decode step's few rows on one core,
// with W as the engine keeps it (row-major (in, out)) or cut into panels of 48 columns stored one after another
// ((N / 48, K, 48): each panel's K x 48 floats contiguous)? The same AVX-512 kernel in both: 8 rows x 48 columns
// of c in registers, K in order, b's rows prefetched `ahead` rows ahead. W is taken from enough copies (~400 MB)
// that it streams from memory as a model's layers do. Run by `python -m benchmarks.probes.few_rows`.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace {

constexpr int kRows = 8;
constexpr int64_t kCols = 48;
int64_t kRowsAhead = 8;  // set by main: 0 turns the prefetch off

__attribute__((target("avx512f"))) inline __mmask16 Lanes(int64_t cols, int64_t first) {
  const int64_t n = std::clamp<int64_t>(cols - first, 0, 16);
  return static_cast<__mmask16>((1u << n) - 1u);
}

// c[0:R, 0:cols] = a[0:R, 0:k] @ b[0:k, 0:cols], cols <= kCols.
template <int R>
__attribute__((target("avx512f"))) void Panel(const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                                              int64_t ldc, int64_t k, int64_t cols) {
  const __mmask16 m0 = Lanes(cols, 0), m1 = Lanes(cols, 16), m2 = Lanes(cols, 32);
  __m512 acc[R][3];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const float *row = b + i * ldb;
    if (kRowsAhead > 0 && i + kRowsAhead < k) {
      const char *ahead = reinterpret_cast<const char *>(row + kRowsAhead * ldb);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      _mm_prefetch(ahead + 128, _MM_HINT_T0);
    }
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, row);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, row + 16);
    const __m512 b2 = _mm512_maskz_loadu_ps(m2, row + 32);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + i]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(x, b2, acc[r][2]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc[r][0]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc[r][1]);
    _mm512_mask_storeu_ps(c + r * ldc + 32, m2, acc[r][2]);
  }
}

using PanelFn = void (*)(const float *, int64_t, const float *, int64_t, float *, int64_t, int64_t, int64_t);
constexpr PanelFn kPanels[kRows + 1] = {nullptr,   Panel<1>, Panel<2>, Panel<3>, Panel<4>,
                                        Panel<5>, Panel<6>, Panel<7>, Panel<8>};

}  // namespace

// c[0:m, c0:c1] = a (m, k) @ b[:, c0:c1], with b's rows ldb apart and c's ldc apart.
void SkinnyBlock(const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, int64_t m,
                 int64_t k, int64_t c0, int64_t c1) {
  for (int64_t j = c0; j < c1; j += kCols) {
    const int64_t cols = std::min(kCols, c1 - j);
    for (int64_t r = 0; r < m; r += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r));
      kPanels[rows](a + r * lda, lda, b + j, ldb, c + r * ldc + j, ldc, k, cols);
    }
  }
}

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

int main(int argc, char **argv) {
  kRowsAhead = argc > 1 ? std::atoi(argv[1]) : 8;
  struct Shape { int m, k, n; const char *name; };
  // the 0.5B engine's fused products (q/k/v 896 -> 1152, o 896 -> 896, gate/up 896 -> 9728, down 4864 -> 896), the
  // widths rounded up to whole panels
  const Shape shapes[] = {{16, 896, 1152, "qkv"}, {16, 896, 912, "o"}, {16, 896, 9744, "gate_up"},
                          {16, 4864, 912, "down"}, {4, 896, 9744, "gate_up"}, {64, 896, 9744, "gate_up"}};
  std::mt19937 gen(0);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Shape &s : shapes) {
    const int copies = 1 + static_cast<int>(400e6 / (4.0 * s.k * s.n));
    std::vector<float> a(static_cast<size_t>(s.m) * s.k), c(static_cast<size_t>(s.m) * s.n);
    std::vector<std::vector<float>> w(copies, std::vector<float>(static_cast<size_t>(s.k) * s.n));
    for (float &x : a) x = u(gen);
    for (auto &v : w) for (float &x : v) x = u(gen);
    for (int packed = 0; packed < 2; ++packed) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < copies; ++i) {
        const float *W = w[i].data();
        if (!packed) {
          SkinnyBlock(a.data(), s.k, W, s.n, c.data(), s.n, s.m, s.k, 0, s.n);
        } else {
          for (int p = 0; p < s.n / kCols; ++p)
            SkinnyBlock(a.data(), s.k, W + static_cast<size_t>(p) * s.k * kCols, kCols, c.data() + p * kCols, s.n,
                        s.m, s.k, 0, kCols);
        }
      }
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%-8s (%2d, %4d, %4d) %-7s ahead %2lld: %6.1f GFLOP/s, %5.1f GB/s of W\n", s.name, s.m, s.k, s.n,
                  packed ? "panels" : "(in,out)", static_cast<long long>(kRowsAhead),
                  2.0 * s.m * s.k * s.n * copies / t / 1e9, 4.0 * s.k * s.n * copies / t / 1e9);
    }
  }
}
