// deform_conv2d for ONNX Runtime (float and double): torchvision's deformable convolution.
//
// Inputs: input (N, C, H, W), weight (M, C/groups, kh, kw), offset (N, 2*og*kh*kw, Ho, Wo),
// bias (M) optional, mask (N, og*kh*kw, Ho, Wo) optional. Attributes: stride, padding,
// dilation (INTS), groups, offset_groups (INT).
//
// "Sample into columns, then GEMM": the sampling is deform_conv2d_core.h's (channels-last
// bilinear blends, vectorized over channels); every parallel loop runs on ORT's intra-op
// threads (KernelContext_ParallelFor), so the session's thread count is what the op uses.
// Which dimension is split depends on the layer:
//   - many output positions per image (early, large layers): tiles of positions, each
//     sampled and multiplied while its columns are in L2 (one task per tile);
//   - few positions per image, many channels (late layers: 512 channels at 7x7): the
//     columns of a chunk of positions (several images together when they are small) are
//     sampled in parallel, then multiplied in blocks of output channels, then of positions.
// The GEMM is Strips: the weight packed in strips of output channels and a register-blocked
// micro-kernel (BLAS would copy the weight on every call). The fused regime uses OpenBLAS
// instead (scipy-openblas32, linked through the package's NativeKernels, single-threaded
// per call) for a weight that is a graph input, and for a constant weight where strips do
// not pay (a weight group's output channels padded to whole strips would add over 25% of
// multiply-adds); the two-phase regime always uses strips.
// The weight is reordered to the columns' k order, and packed in strips, once per kernel if
// it is a constant initializer (the usual case); otherwise once per call.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <cblas.h>  // scipy-openblas32: the same API with scipy_-prefixed names

#include <graphkit/kernel.h>
#include "deform_conv2d_core.h"

namespace gk {
namespace {

// Columns of one fused tile (all weight groups) stay within this: half of a typical L2.
constexpr int64_t kTileBytes = 512 * 1024;
// Columns sampled at once in the two-phase regime (a slice of L3).
constexpr int64_t kChunkBytes = 8 * 1024 * 1024;
// Tasks to aim at per parallel loop: enough to balance 2-4 threads, few enough that each
// task's share of the weight (read once per task) stays small.
constexpr int64_t kTasks = 4;
// Most blocks the two-phase GEMM is split into (each block reads its strips of the weight
// for its rows).
constexpr int64_t kMaxBlocks = 64;
// Fewest positions a sampling task handles (the corner math runs 16 positions per step).
constexpr int64_t kMinSamplePositions = 16;
// Fewest elements a copying or sampling task handles: below, waking another thread (tens of
// microseconds, milliseconds on a busy machine) costs more than it saves.
constexpr int64_t kMinTaskElements = 1 << 18;

// Scratch buffers above this are released after use (a large call would otherwise pin its
// images, columns and weight copies per thread for the life of the process); smaller ones
// are kept for the next call.
constexpr size_t kKeepBytes = size_t(64) << 20;

// A 64-byte aligned array, grown on demand.
template <class T>
class Aligned {
 public:
  Aligned() = default;
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  ~Aligned() { std::free(data_); }
  T* data() { return data_; }
  const T* data() const { return data_; }
  void reserve(size_t n) {
    if (n <= capacity_) return;
    std::free(data_);
    data_ = nullptr;
    capacity_ = 0;
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    data_ = static_cast<T*>(p);
    capacity_ = n;
  }
  size_t bytes() const { return capacity_ * sizeof(T); }
  void release() {
    std::free(data_);
    data_ = nullptr;
    capacity_ = 0;
  }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

// ---- SIMD vectors along output channels ------------------------------------------------

template <class T>
struct Simd;

#if defined(__AVX512F__)
template <>
struct Simd<float> {
  using V = __m512;
  static constexpr int L = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
template <>
struct Simd<double> {
  using V = __m512d;
  static constexpr int L = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static V set1(double x) { return _mm512_set1_pd(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
};
constexpr int kMR = 7, kNV = 4;  // 28 accumulators of 32 registers (one B operand read from L1)
#elif defined(__AVX2__) && defined(__FMA__)
template <>
struct Simd<float> {
  using V = __m256;
  static constexpr int L = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};
template <>
struct Simd<double> {
  using V = __m256d;
  static constexpr int L = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static V set1(double x) { return _mm256_set1_pd(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
};
constexpr int kMR = 6, kNV = 2;  // 12 accumulators of 16 registers
#else
// Portable fallback: GCC/Clang vector extensions (SSE2 on baseline x86-64, NEON on ARM).
template <class T>
struct Simd {
  static constexpr int L = 16 / sizeof(T);
  typedef T V __attribute__((vector_size(16)));
  typedef T VU __attribute__((vector_size(16), aligned(sizeof(T))));  // unaligned access
  static V zero() { return V{}; }
  static V load(const T* p) { return *reinterpret_cast<const VU*>(p); }
  static void store(T* p, V v) { *reinterpret_cast<VU*>(p) = v; }
  static V set1(T x) { return V{} + x; }
  static V fma(V a, V b, V c) { return a * b + c; }
};
constexpr int kMR = 4, kNV = 2;  // 8 accumulators of 16 registers
#endif


// The GEMM (see the top of the file): output channels x positions. OpenBLAS packs both
// operands on every call; there, repacking the weight is ~18% of the call (perf:
// sgemm_oncopy at 512 channels, 7x7). So the weight is packed once
// per kernel into strips of NR output channels (k-major) and multiplied by a
// register-blocked micro-kernel: MR positions x NR channels per tile, K in blocks of kKC so
// that a block of a strip stays in L2 while the tiles of the chunk's positions pass over
// it. Rows are not padded: a chunk's last tile takes the micro-kernel of its row count
// (49 positions at 7x7 are 7 tiles of 7; padding them to 12-row tiles wasted 18% of the
// FMAs). Measured on Zen 4 (one thread, 512x4608 by 4608x49): ~105 GFLOP/s of a 115
// register-only peak, OpenBLAS's sgemm 71 (at 392 positions: 107 vs 93).
constexpr int64_t kKC = 384;

template <class T>
struct Strips {
  using S = Simd<T>;
  using V = typename S::V;
  static constexpr int MR = kMR, NV = kNV, NR = NV * S::L;

  // tile (R x NR) = [tile +] a (R rows, row stride lda) * b (K x NR, one packed strip).
  template <int R>
  static void micro(int64_t K, const T* a, int64_t lda, const T* b, T* tile, bool add) {
    const T* ar[R];
    for (int r = 0; r < R; ++r) ar[r] = a + r * lda;
    V acc[R][NV];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = add ? S::load(tile + r * NR + v * S::L) : S::zero();
    for (int64_t k = 0; k < K; ++k) {
      V bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = S::load(b + k * NR + v * S::L);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const V av = S::set1(ar[r][k]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = S::fma(av, bv[v], acc[r][v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) S::store(tile + r * NR + v * S::L, acc[r][v]);
  }

  using Kernel = void (*)(int64_t, const T*, int64_t, const T*, T*, bool);
  template <size_t... R>
  static constexpr std::array<Kernel, sizeof...(R)> kernels(std::index_sequence<R...>) {
    return {&micro<int(R) + 1>...};
  }
  // micro<rows> for 1 <= rows <= MR.
  static void multiply(int64_t rows, int64_t K, const T* a, int64_t lda, const T* b, T* tile, bool add) {
    static constexpr std::array<Kernel, MR> table = kernels(std::make_index_sequence<MR>());
    table[size_t(rows - 1)](K, a, lda, b, tile, add);
  }

  // Strip `st` of group `gw` from the reordered weight (M, K): out[gw][st][k][NR], zero past
  // the group's last output channel.
  static void pack(int64_t K, int64_t mg, const T* wr, T* out, int64_t gw, int64_t st) {
    const int64_t strips = (mg + NR - 1) / NR, m0 = gw * mg + st * NR, count = std::min<int64_t>(NR, mg - st * NR);
    T* dst = out + (gw * strips + st) * K * NR;
    if (count < NR) std::fill_n(dst, K * NR, T(0));
    for (int64_t i = 0; i < count; ++i) {
      const T* src = wr + (m0 + i) * K;
      for (int64_t k = 0; k < K; ++k) dst[k * NR + i] = src[k];
    }
  }
};

// c (m x n, row stride ldc) = a (m x k, row-major) * b^T, b being n x k row-major.
inline void gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                    float* c, int64_t ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(n), blasint(k), 1.0f, a,
                    blasint(lda), b, blasint(ldb), 0.0f, c, blasint(ldc));
}
inline void gemm_nt(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb,
                    double* c, int64_t ldc) {
  scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(n), blasint(k), 1.0, a,
                    blasint(lda), b, blasint(ldb), 0.0, c, blasint(ldc));
}

// OpenBLAS's own threads stay idle: each call runs on the ORT thread that makes it.
// (Process-wide for this copy of OpenBLAS, which only native kernels load.)
void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { scipy_openblas_set_num_threads(1); });
}

// weight (M, cin_g, kh, kw) -> (M, kh * kw, cin_g): the columns' k order (tap * cin_g + c).
template <class T>
void reorder_weight(const dcn::Geometry& g, const T* weight, T* out, int64_t m0, int64_t m1) {
  const int64_t kk = g.taps(), cin_g = g.cin_g;
  for (int64_t m = m0; m < m1; ++m) {
    const T* src = weight + m * cin_g * kk;
    T* dst = out + m * cin_g * kk;
    for (int64_t c = 0; c < cin_g; ++c)
      for (int64_t t = 0; t < kk; ++t) dst[t * cin_g + c] = src[c * kk + t];
  }
}

template <class T>
void release_if_large(Aligned<T>& buffer) {
  if (buffer.bytes() > kKeepBytes) buffer.release();
}

// Per-thread buffers, reused across calls up to kKeepBytes each: `cols` by every thread
// running fused tiles, `tiles` by every thread running strips GEMM tasks (each released
// after its task when larger); the rest by the thread that called Compute (read by the
// others meanwhile; released at the end of the call when larger).
template <class T>
struct Scratch {
  Aligned<T> cols, pixels, weight, chunk, tiles, strips;
  void release_large() {
    for (Aligned<T>* b : {&cols, &pixels, &weight, &chunk, &tiles, &strips}) release_if_large(*b);
  }
};

template <class T>
Scratch<T>& scratch() {
  thread_local Scratch<T> s;
  return s;
}

// Ceil division.
inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How many of ORT's intra-op threads take part in this kernel's parallel loops: the most
// distinct threads seen running the tasks of one loop so far (ORT does not tell a custom
// op its thread count). The two-phase strips GEMM is split into that many blocks (at least
// 2), each reading only its strips of the weight; the fused regime rounds its tile count
// to a multiple of it.
class Concurrency {
 public:
  int64_t threads() const { return seen_.load(std::memory_order_relaxed); }
  // Runs fn(i) for i in [0, total) on ctx's threads, noting which threads ran them.
  template <class F>
  void parallel_for(Context& ctx, size_t total, F&& fn) {
    std::vector<std::thread::id> ids(total);
    ctx.parallel_for(total, [&](size_t i) {
      ids[i] = std::this_thread::get_id();
      fn(i);
    });
    std::sort(ids.begin(), ids.end());
    const int64_t distinct = std::unique(ids.begin(), ids.end()) - ids.begin();
    int64_t now = seen_.load(std::memory_order_relaxed);
    while (distinct > now && !seen_.compare_exchange_weak(now, distinct)) {
    }
  }

 private:
  std::atomic<int64_t> seen_{1};
};

// `wp`: the weight in the columns' k order; `strip_weight()`: the same packed in strips
// (Strips<T>); `weight_constant`: strip_weight() packs only once (a constant initializer).
template <class T, class StripWeight>
void run(Context& ctx, Concurrency& concurrency, const dcn::Geometry& g, const T* x, const T* wp,
         StripWeight&& strip_weight, bool weight_constant, const T* offset, const T* bias, const T* mask,
         T* y) {
  single_threaded_blas();
  const int64_t K = g.group_k(), mg = g.mg(), np = g.positions(), hw = g.h * g.w, kg = K * g.groups;
  const int64_t kk = g.taps(), og = g.offset_groups;
  Scratch<T>& own = scratch<T>();

  // Channels-last images, each followed by one zero pixel.
  Aligned<T>& pixels = own.pixels;
  pixels.reserve(size_t(g.n * (hw + 1) * g.c));
  const int64_t row_chunk = std::max<int64_t>(1, cdiv(kMinTaskElements, std::max<int64_t>(1, g.w * g.c)));
  const int64_t chunks_per_image = cdiv(g.h, row_chunk);
  for (int64_t n = 0; n < g.n; ++n) std::fill_n(pixels.data() + (n * (hw + 1) + hw) * g.c, g.c, T(0));
  ctx.parallel_for(size_t(g.n * chunks_per_image), [&](size_t task) {
    const int64_t n = int64_t(task) / chunks_per_image, y0 = (int64_t(task) % chunks_per_image) * row_chunk;
    dcn::to_channels_last(g, x + n * g.c * hw, pixels.data() + n * (hw + 1) * g.c, y0, std::min(g.h, y0 + row_chunk));
  });
  auto image = [&](int64_t n) { return pixels.data() + n * (hw + 1) * g.c; };
  auto offsets = [&](int64_t n) { return offset + n * 2 * og * kk * np; };
  auto masks = [&](int64_t n) { return mask ? mask + n * og * kk * np : nullptr; };
  auto add_bias = [&](T* out, int64_t m0, int64_t m1, int64_t count, int64_t ld) {
    if (bias == nullptr) return;
    for (int64_t m = m0; m < m1; ++m) {
      const T b = bias[m];
      T* row = out + (m - m0) * ld;
      for (int64_t i = 0; i < count; ++i) row[i] += b;
    }
  };

  // The strips GEMM of rows [r0, r1) of weight group gw's columns `a` (row stride K) by
  // strips [s0, s1) of `pk`; row r is position j = j0 + r (n = j / np, p = j % np), written
  // to y with the bias.
  using SG = Strips<T>;
  constexpr int64_t MR = SG::MR, NR = SG::NR;
  const int64_t strips = cdiv(mg, NR);
  // Strips pad a weight group's output channels to a multiple of NR; past 25% more
  // multiply-adds (e.g. 40 channels in strips of 64, or depthwise groups) OpenBLAS is faster.
  const bool strips_pay = strips * NR * 4 <= mg * 5;
  auto strips_gemm = [&](const T* pk, const T* a, int64_t gw, int64_t j0, int64_t r0, int64_t r1, int64_t s0,
                         int64_t s1) {
    const int64_t rows = r1 - r0;
    Aligned<T>& tiles = scratch<T>().tiles;
    tiles.reserve(size_t((s1 - s0) * rows * NR));
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min(kKC, K - k0);
      for (int64_t st = s0; st < s1; ++st) {
        const T* b = pk + ((gw * strips + st) * K + k0) * NR;
        T* tile = tiles.data() + (st - s0) * rows * NR;  // row r at (r - r0) * NR
        for (int64_t r = r0; r < r1; r += MR)
          SG::multiply(std::min(MR, r1 - r), kc, a + r * K + k0, K, b, tile + (r - r0) * NR, k0 > 0);
      }
    }
    for (int64_t st = s0; st < s1; ++st) {  // (positions x channels) tiles -> (N, M, P)
      const T* tile = tiles.data() + (st - s0) * rows * NR;
      const int64_t m0 = gw * mg + st * NR, count = std::min<int64_t>(NR, mg - st * NR);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = (j0 + r) / np, p = j0 + r - n * np;
        T* dst = y + (n * g.m + m0) * np + p;
        for (int64_t i = 0; i < count; ++i) dst[i * np] = tile[(r - r0) * NR + i] + (bias ? bias[m0 + i] : T(0));
      }
    }
    release_if_large(tiles);
  };

  // Fused regime: tiles of positions of one image whose columns fit kTileBytes, when a tile
  // holds at least half as many positions as a weight group has output channels (so the
  // weight, read once per tile, is not much bigger than the tile's columns), or when strips
  // do not pay. Each tile is multiplied by the strips (a constant weight, packed once: 13-15%
  // less CPU time than OpenBLAS at 64@56 and 128@28, which repacks the weight per tile) or by
  // OpenBLAS (a weight that is an input, which strips would also have to repack on every
  // call, or too few output channels per group for whole strips).
  const int64_t fit = std::max<int64_t>(1, kTileBytes / int64_t(sizeof(T) * kg));
  if (2 * fit >= mg || !strips_pay) {
    const int64_t most = std::max<int64_t>(1, np / kMinSamplePositions);
    int64_t tiles = std::min(std::max(cdiv(np, fit), cdiv(kTasks, g.n)), most);
    // Few tasks: as many per thread (128@28 at batch 1: 8 tiles, not 7 of which one
    // thread of 2 would run 4).
    const int64_t threads = std::max<int64_t>(2, concurrency.threads());
    if (g.n * tiles < 8 * threads) {
      while (tiles < most && (g.n * tiles) % threads != 0) ++tiles;
    }
    const int64_t tile = cdiv(np, tiles);
    tiles = cdiv(np, tile);
    const T* pk = weight_constant && strips_pay ? strip_weight() : nullptr;
    concurrency.parallel_for(ctx, size_t(g.n * tiles), [&](size_t task) {
      const int64_t n = int64_t(task) / tiles, p0 = (int64_t(task) % tiles) * tile;
      const int64_t count = std::min(np, p0 + tile) - p0;
      Scratch<T>& s = scratch<T>();
      s.cols.reserve(size_t(g.groups * tile * K));
      dcn::sample(g, image(n), offsets(n), masks(n), p0, p0 + count, s.cols.data(), K, tile * K);
      for (int64_t gw = 0; gw < g.groups; ++gw) {
        if (pk != nullptr) {
          strips_gemm(pk, s.cols.data() + gw * tile * K, gw, n * np + p0, 0, count, 0, strips);
          continue;
        }
        T* out = y + (n * g.m + gw * mg) * np + p0;
        gemm_nt(mg, count, K, wp + gw * mg * K, K, s.cols.data() + gw * tile * K, K, out, np);
        add_bias(out, gw * mg, (gw + 1) * mg, count, np);
      }
      release_if_large(s.cols);
    });
    return;
  }

  // Two-phase regime: chunks of consecutive positions j = n * np + p (across images).
  const int64_t total = g.n * np;
  const int64_t chunk = std::min(total, std::max<int64_t>(1, kChunkBytes / int64_t(sizeof(T) * kg)));
  own.chunk.reserve(size_t(chunk * kg));
  T* cols = own.chunk.data();
  const T* pk = strip_weight();  // an input weight is packed once per call, not per chunk
  for (int64_t j0 = 0; j0 < total; j0 += chunk) {
    const int64_t j1 = std::min(total, j0 + chunk), len = j1 - j0;
    // Phase 1: sample pieces of at least kMinSamplePositions and kMinTaskElements, never
    // across images.
    const int64_t piece = std::max({kMinSamplePositions, cdiv(kMinTaskElements, kg), cdiv(len, 2 * kTasks)});
    std::vector<std::pair<int64_t, int64_t>> pieces;  // [j, j_end)
    for (int64_t j = j0; j < j1;) {
      const int64_t end = std::min({j1, j + piece, (j / np + 1) * np});
      pieces.emplace_back(j, end);
      j = end;
    }
    concurrency.parallel_for(ctx, pieces.size(), [&](size_t i) {
      const auto [a, b] = pieces[i];
      const int64_t n = a / np;
      dcn::sample(g, image(n), offsets(n), masks(n), a - n * np, b - n * np, cols + (a - j0) * K, K, len * K);
    });
    // Phase 2: the strips GEMM, tasks of (weight group, block of strips, block of rows);
    // strips are split first (each task reads only its part of the weight), rows when there
    // are fewer strips than threads. A sum's order never depends on the split.
    const int64_t want = cdiv(std::clamp<int64_t>(concurrency.threads(), 2, kMaxBlocks), g.groups);
    const int64_t sb = cdiv(strips, std::min(want, strips)), sblocks = cdiv(strips, sb);
    const int64_t rb = cdiv(cdiv(len, std::min(cdiv(want, sblocks), cdiv(len, MR))), MR) * MR;
    const int64_t rblocks = cdiv(len, rb);
    ctx.parallel_for(size_t(g.groups * sblocks * rblocks), [&](size_t task) {
      const int64_t gw = int64_t(task) / (sblocks * rblocks), rest = int64_t(task) % (sblocks * rblocks);
      const int64_t s0 = (rest / rblocks) * sb, r0 = (rest % rblocks) * rb;
      strips_gemm(pk, cols + gw * len * K, gw, j0, r0, std::min(len, r0 + rb), s0, std::min(strips, s0 + sb));
    });
  }
}

// Inputs 3 (bias) and 4 (mask) are optional.
OrtCustomOpInputOutputCharacteristic input_characteristic(const OrtCustomOp*, size_t index) {
  return index >= 3 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}

template <class T, ONNXTensorElementDataType TYPE>
struct DeformConv2d {
  static const char* name() { return "deform_conv2d"; }
  static constexpr ONNXTensorElementDataType inputs[] = {TYPE, TYPE, TYPE, TYPE, TYPE};
  static constexpr ONNXTensorElementDataType outputs[] = {TYPE};

  dcn::Attributes attrs;
  // A constant weight, reordered at creation (reorder_weight); empty when the weight is not
  // a constant initializer. `constant` is the initializer's data: used only when Compute
  // sees the same buffer with the same shape.
  Aligned<T> reordered;
  const void* constant = nullptr;
  Shape constant_shape;
  Concurrency concurrency;
  // The constant weight packed in strips (Strips<T>::pack), made on first need.
  Aligned<T> strips;
  std::once_flag strips_once;

  DeformConv2d(const Api&, const KernelInfo& info) {
    if (info.has("stride")) attrs.stride = info.get_ints("stride");
    if (info.has("padding")) attrs.padding = info.get_ints("padding");
    if (info.has("dilation")) attrs.dilation = info.get_ints("dilation");
    attrs.groups = info.get_int("groups", 1);
    attrs.offset_groups = info.get_int("offset_groups", 1);
    TensorView w;
    if (info.constant_input(1, w) && w.type == TYPE && w.shape.size() == 4 && w.size > 0) {
      dcn::Geometry g;
      g.cin_g = w.shape[1], g.kh = w.shape[2], g.kw = w.shape[3];
      reordered.reserve(w.size);
      reorder_weight(g, w.as<T>(), reordered.data(), 0, w.shape[0]);
      constant = w.data, constant_shape = w.shape;
    }
  }

  // The weight in the columns' k order: the one reordered at creation, or reordered now.
  const T* weight(Context& ctx, const dcn::Geometry& g, const TensorView& w) {
    if (constant != nullptr && w.data == constant && w.shape == constant_shape) return reordered.data();
    Aligned<T>& buffer = scratch<T>().weight;
    buffer.reserve(w.size);
    const int64_t block = std::max<int64_t>(1, cdiv(g.m, 4 * kTasks));
    ctx.parallel_for(size_t(cdiv(g.m, block)), [&](size_t i) {
      reorder_weight(g, w.as<T>(), buffer.data(), int64_t(i) * block, std::min(g.m, int64_t(i + 1) * block));
    });
    return buffer.data();
  }

  // The optional input `index`, or nullopt-like (present == false) when the node omits it.
  static bool optional_input(Context& ctx, size_t count, size_t index, TensorView& out) {
    if (index >= count) return false;
    const OrtValue* value = nullptr;
    ctx.api().check(ort::KernelContext_GetInput(ctx.api().raw())(ctx.raw(), index, &value), "KernelContext_GetInput");
    if (value == nullptr) return false;
    out = ctx.input(index);
    return true;
  }

  void compute(Context& ctx) {
    const Api& api = ctx.api();
    const size_t count = ctx.input_count();
    const TensorView x = ctx.input(0), w = ctx.input(1), off = ctx.input(2);
    TensorView b, m;
    const bool has_bias = optional_input(ctx, count, 3, b), has_mask = optional_input(ctx, count, 4, m);
    for (const TensorView* t : std::initializer_list<const TensorView*>{&x, &w, &off, has_bias ? &b : nullptr, has_mask ? &m : nullptr}) {
      if (t != nullptr && t->type != TYPE) api.fail(ORT_INVALID_ARGUMENT, "all inputs must have the same element type");
    }
    dcn::Geometry g;
    const std::string problem =
        dcn::check(attrs, x.shape, w.shape, off.shape, has_bias ? &b.shape : nullptr, has_mask ? &m.shape : nullptr, g);
    if (!problem.empty()) api.fail(ORT_INVALID_ARGUMENT, problem);
    T* y = ctx.output<T>(0, {g.n, g.m, g.ho, g.wo});
    if (g.n == 0 || g.m == 0) return;
    const T* wr = weight(ctx, g, w);
    auto strip_weight = [&]() -> const T* {
      const int64_t nr = Strips<T>::NR, count = cdiv(g.mg(), nr), K = g.group_k();
      auto fill = [&](T* out) {
        ctx.parallel_for(size_t(g.groups * count), [&](size_t i) {
          Strips<T>::pack(K, g.mg(), wr, out, int64_t(i) / count, int64_t(i) % count);
        });
      };
      const size_t size = size_t(g.groups * count * K * nr);
      if (wr == reordered.data()) {  // the constant weight: packed once
        std::call_once(strips_once, [&] {
          strips.reserve(size);
          fill(strips.data());
        });
        return strips.data();
      }
      Aligned<T>& buffer = scratch<T>().strips;
      buffer.reserve(size);
      fill(buffer.data());
      return buffer.data();
    };
    run<T>(ctx, concurrency, g, x.as<T>(), wr, strip_weight, wr == reordered.data(), off.as<T>(), has_bias ? b.as<T>() : nullptr, has_mask ? m.as<T>() : nullptr,
           y);
    scratch<T>().release_large();
  }

  // (N, M, Ho, Wo) = (input[0], weight[0], offset[2], offset[3]); symbolic dims kept.
  static void infer_shapes(ShapeInferContext& ctx) {
    if (ctx.input_count() < 3) return;
    const ShapeInfo x = ctx.input(0), w = ctx.input(1), off = ctx.input(2);
    if (x.dims.size() != 4 || w.dims.size() != 4 || off.dims.size() != 4) return;  // Compute reports it
    ShapeInfo out;
    out.type = x.type;
    out.dims = {x.dims[0], w.dims[0], off.dims[2], off.dims[3]};
    out.symbols = {x.symbols[0], w.symbols[0], off.symbols[2], off.symbols[3]};
    ctx.set_output(0, out);
  }
};

template <class K>
OrtCustomOp make_deform_op() {
  OrtCustomOp op = make_op<K>();
  op.GetInputCharacteristic = &input_characteristic;
  return op;
}

}  // namespace
}  // namespace gk

GRAPHKIT_OPS(deform_conv2d,
             gk::make_deform_op<gk::DeformConv2d<float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>>(),
             gk::make_deform_op<gk::DeformConv2d<double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>>())
