// Causal attention over packed rows, forward only, as a MindSpore `ops.Custom` "aot" kernel for the CPU backend
// (the reward scorer's attention: mindgrpo/models/block_attention.py). params = (q, k, v, segments, out):
//   q (B, nh, S, d) fp32, already scaled by 1/sqrt(d); k, v (B, nkv, S, d) fp32; segments (B, S) int32;
//   out (B, nh, S, d) fp32, written whole.
// Query heads h*g .. h*g+g-1 (g = nh / nkv) share kv head h. A query attends to the keys at or before it within its
// run: a maximal stretch of equal segment ids along the row (a packed sequence; the padding at a row's end is one
// run too, as the masks of BlockAttention's MindSpore path treat it). So only the keys of a query's own sequence
// are ever touched: the work is the sum of the sequences' squares, not the row's.
//
// Per (row, kv head, run, block of kBlock queries, query head): scores = q_block k_run^T with OpenBLAS's sgemm over
// the run's keys up to the block's last query, each query's row softmaxed over its keys (the later ones weigh 0
// exactly), then out_block = p v_run with sgemm. The tasks are split over `g_threads` threads (sgemm.cc's count),
// each with a scratch buffer of its own; OpenBLAS itself runs single-threaded (MindgrpoSetThreads).
// A nonzero return makes MindSpore raise: a wrong dtype, rank or shape.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#include <cblas.h>

int MindgrpoThreads();  // sgemm.cc: the threads a product is split over

namespace {

constexpr int64_t kBlock = 128;  // queries a task takes (its scores: kBlock x the run's keys up to them)

// exp(x) for x <= 0 (a score minus its row's largest): 2^k e^f with k = round(x / ln 2) and f = x - k ln 2 in
// [-ln 2 / 2, ln 2 / 2], e^f by its Taylor polynomial to degree 7 (relative error below 2e-8 there, under fp32's
// rounding), 2^k put into the exponent's bits. Below -86 the result is 0 (exp(-86) < 4.5e-38: a weight that
// rounds away beside the row's largest, which weighs 1; above it k >= -124, so e 2^k is a normal number). Plain
// arithmetic, so the loops below vectorize.
inline float ExpNonPositive(float x) {
  if (x < -86.0f) return 0.0f;
  const float k = std::nearbyint(x * 1.44269504088896341f);
  const float f = (x - k * 0.693145751953125f) - k * 1.428606765330187045e-06f;  // ln 2 in two parts
  float e = 1.0f / 5040.0f;
  e = e * f + 1.0f / 720.0f;
  e = e * f + 1.0f / 120.0f;
  e = e * f + 1.0f / 24.0f;
  e = e * f + 1.0f / 6.0f;
  e = e * f + 0.5f;
  e = e * f + 1.0f;
  e = e * f + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &e, sizeof bits);
  bits += static_cast<int32_t>(k) * (1 << 23);  // e in [0.7, 1.5), k in [-124, 0]: the exponent field stays >= 1
  std::memcpy(&e, &bits, sizeof bits);
  return e;
}

// r[0:n] <- softmax(r[0:n]), in place; a version for each vector width, chosen at load time.
__attribute__((target_clones("avx512f", "avx2", "default")))
void Softmax(float *r, int64_t n) {
  float top = r[0];
  for (int64_t j = 1; j < n; ++j) top = std::max(top, r[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    r[j] = ExpNonPositive(r[j] - top);
    sum += r[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) r[j] *= inv;
}

struct Shapes {
  int64_t b, nh, nkv, s, d;
};

struct Task {
  int64_t row, head, start, first, last;  // query head `head` of row `row`, queries [first, last) of the run at start
};

// One task: queries [first, last) of query head `head` attend to keys [start, query] of their run.
void Attend(const Shapes &sh, const float *q, const float *k, const float *v, float *out, const Task &t,
            std::vector<float> &scratch) {
  const int64_t g = sh.nh / sh.nkv, n = t.last - t.first, keys = t.last - t.start;
  const int64_t kv = (t.row * sh.nkv + t.head / g) * sh.s * sh.d;  // this head's k / v at the row's start
  const int64_t at = (t.row * sh.nh + t.head) * sh.s * sh.d;
  scratch.resize(static_cast<size_t>(n * keys));
  float *p = scratch.data();
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)n, (blasint)keys, (blasint)sh.d, 1.0f,
                    q + at + t.first * sh.d, (blasint)sh.d, k + kv + t.start * sh.d, (blasint)sh.d, 0.0f, p,
                    (blasint)keys);
  for (int64_t i = 0; i < n; ++i) {
    float *r = p + i * keys;
    const int64_t seen = t.first + i - t.start + 1;  // keys at or before the query
    Softmax(r, seen);
    std::fill(r + seen, r + keys, 0.0f);
  }
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)n, (blasint)sh.d, (blasint)keys, 1.0f, p,
                    (blasint)keys, v + kv + t.start * sh.d, (blasint)sh.d, 0.0f, out + at + t.first * sh.d,
                    (blasint)sh.d);
}

}  // namespace

extern "C" {

int SegmentAttention(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 5) return 1;
  const int want[5] = {4, 4, 4, 2, 4};
  for (int i = 0; i < 5; ++i) {
    if (ndims[i] != want[i]) return 2;
    if (std::strcmp(dtypes[i], i == 3 ? "int32" : "float32") != 0) return 2;
  }
  const Shapes sh{shapes[0][0], shapes[0][1], shapes[1][1], shapes[0][2], shapes[0][3]};
  for (int i : {1, 2}) {
    if (shapes[i][0] != sh.b || shapes[i][1] != sh.nkv || shapes[i][2] != sh.s || shapes[i][3] != sh.d) return 3;
  }
  if (shapes[3][0] != sh.b || shapes[3][1] != sh.s) return 3;
  for (int j = 0; j < 4; ++j) {
    if (shapes[4][j] != shapes[0][j]) return 3;
  }
  if (sh.nkv == 0 || sh.nh % sh.nkv != 0) return 3;
  const float *q = static_cast<const float *>(params[0]);
  const float *k = static_cast<const float *>(params[1]);
  const float *v = static_cast<const float *>(params[2]);
  const int32_t *seg = static_cast<const int32_t *>(params[3]);
  float *out = static_cast<float *>(params[4]);
  if (sh.b == 0 || sh.nh == 0 || sh.s == 0 || sh.d == 0) return 0;

  std::vector<Task> tasks;
  for (int64_t row = 0; row < sh.b; ++row) {
    const int32_t *ids = seg + row * sh.s;
    for (int64_t start = 0; start < sh.s;) {
      int64_t end = start + 1;
      while (end < sh.s && ids[end] == ids[start]) ++end;
      for (int64_t first = start; first < end; first += kBlock) {
        for (int64_t head = 0; head < sh.nh; ++head) {
          tasks.push_back(Task{row, head, start, first, std::min(end, first + kBlock)});
        }
      }
      start = end;
    }
  }
  // Longest first, dealt round-robin: the threads get about the same work.
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task &a, const Task &b) { return a.last - a.start > b.last - b.start; });
  const int parts = std::max(1, std::min<int>(MindgrpoThreads(), static_cast<int>(tasks.size())));
  auto work = [&](int part) {
    std::vector<float> scratch;
    for (size_t i = part; i < tasks.size(); i += parts) Attend(sh, q, k, v, out, tasks[i], scratch);
  };
  std::vector<std::thread> workers;
  for (int part = 1; part < parts; ++part) workers.emplace_back(work, part);
  work(0);
  for (auto &w : workers) w.join();
  return 0;
}

}  // extern "C"
