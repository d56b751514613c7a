// deform_conv2d for ONNX Runtime (float and double): torchvision's deformable convolution.
//
// Inputs: input (N, C, H, W), weight (M, C/groups, kh, kw), offset (N, 2*og*kh*kw, Ho, Wo),
// bias (M) optional, mask (N, og*kh*kw, Ho, Wo) optional. Attributes: stride, padding,
// dilation (INTS), groups, offset_groups (INT).
//
// Work is split into tiles of output positions of one image, run on ORT's intra-op threads
// (KernelContext_ParallelFor). A tile is sampled into columns (deform_conv2d_core.h:
// channels-last bilinear blends, vectorized over channels) and immediately multiplied with
// the repacked weight while it is still in cache, by a register-blocked SIMD micro-kernel:
// MR positions x NR output channels per step, the weight packed in NR-wide strips,
// accumulators kept in registers across the whole K loop (measured: ~245 GFLOP/s on one
// AVX-512 core whose FMA peak is ~250). AVX-512, AVX2+FMA and portable builds are chosen
// at compile time (the library is built with -march=native).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <graphkit/kernel.h>
#include "deform_conv2d_core.h"

namespace gk {
namespace {

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
constexpr int kMR = 12, kNV = 2;  // 24 accumulators of 32 registers
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

#ifndef GK_DCN_TILE_BYTES
#define GK_DCN_TILE_BYTES (192 * 1024)
#endif
constexpr int64_t kTileBytes = GK_DCN_TILE_BYTES;  // columns of one tile (all weight groups)
constexpr int64_t kMinTilesPerImage = 8;           // keeps both threads busy on small layers

// A 64-byte aligned array (vector loads and stores of whole cache lines), grown on demand.
template <class T>
class Aligned {
 public:
  Aligned() = default;
  explicit Aligned(size_t n) { reserve(n); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  ~Aligned() { std::free(data_); }
  T* data() { return data_; }
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

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

template <class T>
struct Gemm {
  using S = Simd<T>;
  using V = typename S::V;
  static constexpr int MR = kMR, NV = kNV, NR = NV * S::L;

  // acc[r][:] = sum_k a[r][k] * b[k][:] for MR rows of `a` (row stride lda; rows past
  // `rows` repeat the last one) and one packed NR-wide strip `b` (K x NR).
  static void micro(int64_t K, const T* a, int64_t lda, int64_t rows, const T* b, T* out) {
    const T* ar[MR];
    for (int r = 0; r < MR; ++r) ar[r] = a + std::min<int64_t>(r, rows - 1) * lda;
    V acc[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = S::zero();
    for (int64_t k = 0; k < K; ++k) {
      V bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = S::load(b + k * NR + v * S::L);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const V av = S::set1(ar[r][k]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = S::fma(av, bv[v], acc[r][v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) S::store(out + r * NR + v * S::L, acc[r][v]);
  }

  // weight (M, cin_g, kh, kw) -> [group][strip][k][NR] with k = tap * cin_g + c (the
  // columns' order), zero-padded past the group's last output channel; one strip.
  static void pack(const dcn::Geometry& g, const T* weight, T* out, int64_t gw, int64_t st) {
    const int64_t K = g.group_k(), mg = g.mg(), kk = g.taps(), cin_g = g.cin_g;
    const int64_t strips = (mg + NR - 1) / NR;
    const int64_t m0 = gw * mg + st * NR, count = std::min<int64_t>(NR, mg - st * NR);
    T* dst = out + (gw * strips + st) * K * NR;
    if (count < NR) std::fill_n(dst, K * NR, T(0));
    const T* src = weight + m0 * cin_g * kk;
    for (int64_t ch = 0; ch < cin_g; ++ch)  // the strip's rows at one channel stay in L1 across taps
      for (int64_t t = 0; t < kk; ++t) {
        T* d = dst + (t * cin_g + ch) * NR;
        for (int64_t i = 0; i < count; ++i) d[i] = src[(i * cin_g + ch) * kk + t];
      }
  }
};

// Per-thread buffers, reused across calls: `cols` and `acc` by every thread running tiles,
// `pixels` and `packed` by the thread that called Compute (read by the others meanwhile).
template <class T>
struct Scratch {
  Aligned<T> cols, acc, pixels, packed;
};

template <class T>
Scratch<T>& scratch() {
  thread_local Scratch<T> s;
  return s;
}

template <class T>
void run(Context& ctx, const dcn::Geometry& g, const T* x, const T* weight, const T* offset, const T* bias,
         const T* mask, T* y) {
  using G = Gemm<T>;
  constexpr int MR = G::MR, NR = G::NR;
  const int64_t K = g.group_k(), mg = g.mg(), np = g.positions(), hw = g.h * g.w;
  const int64_t strips = (mg + NR - 1) / NR;

  Scratch<T>& own = scratch<T>();
  // Channels-last images, each followed by one zero pixel.
  Aligned<T>& pixels = own.pixels;
  pixels.reserve(size_t(g.n * (hw + 1) * g.c));
  const int64_t row_chunk = std::max<int64_t>(1, (16384 + g.w * g.c - 1) / std::max<int64_t>(1, g.w * g.c));
  const int64_t chunks_per_image = (g.h + row_chunk - 1) / row_chunk;
  for (int64_t n = 0; n < g.n; ++n) std::fill_n(pixels.data() + (n * (hw + 1) + hw) * g.c, g.c, T(0));
  ctx.parallel_for(size_t(g.n * chunks_per_image), [&](size_t task) {
    const int64_t n = int64_t(task) / chunks_per_image, y0 = (int64_t(task) % chunks_per_image) * row_chunk;
    dcn::to_channels_last(g, x + n * g.c * hw, pixels.data() + n * (hw + 1) * g.c, y0, std::min(g.h, y0 + row_chunk));
  });

  Aligned<T>& packed = own.packed;
  packed.reserve(size_t(g.groups * strips * K * NR));
  ctx.parallel_for(size_t(g.groups * strips), [&](size_t task) {
    G::pack(g, weight, packed.data(), int64_t(task) / strips, int64_t(task) % strips);
  });

  // Tile: a multiple of MR positions whose columns fit kTileBytes, at least kMinTilesPerImage per image.
  int64_t tile = std::max<int64_t>(MR, kTileBytes / int64_t(sizeof(T) * K * g.groups) / MR * MR);
  tile = std::min(tile, std::max<int64_t>(MR, ((np + kMinTilesPerImage - 1) / kMinTilesPerImage + MR - 1) / MR * MR));
  const int64_t tiles = (np + tile - 1) / tile;

  ctx.parallel_for(size_t(g.n * tiles), [&](size_t task) {
    const int64_t n = int64_t(task) / tiles, p0 = (int64_t(task) % tiles) * tile;
    const int64_t p1 = std::min(np, p0 + tile), count = p1 - p0;
    Scratch<T>& s = scratch<T>();
    s.cols.reserve(size_t(g.groups * tile * K));
    s.acc.reserve(size_t(MR * NR));
    const T* off_n = offset + n * 2 * g.offset_groups * g.taps() * np;
    const T* mask_n = mask ? mask + n * g.offset_groups * g.taps() * np : nullptr;
    dcn::sample(g, pixels.data() + n * (hw + 1) * g.c, off_n, mask_n, p0, p1, s.cols.data(), K, tile * K);
    for (int64_t gw = 0; gw < g.groups; ++gw) {
      const T* cols = s.cols.data() + gw * tile * K;
      const T* pk = packed.data() + gw * strips * K * NR;
      T* out = y + (n * g.m + gw * mg) * np + p0;
      for (int64_t r0 = 0; r0 < count; r0 += MR) {
        const int64_t rows = std::min<int64_t>(MR, count - r0);
        for (int64_t st = 0; st < strips; ++st) {
          G::micro(K, cols + r0 * K, K, rows, pk + st * K * NR, s.acc.data());
          const int64_t m0 = st * NR, m1 = std::min(mg, m0 + NR);
          for (int64_t m = m0; m < m1; ++m) {
            const T b = bias ? bias[gw * mg + m] : T(0);
            T* dst = out + m * np + r0;
            for (int64_t r = 0; r < rows; ++r) dst[r] = s.acc.data()[r * NR + (m - m0)] + b;
          }
        }
      }
    }
  });
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

  DeformConv2d(const Api&, const KernelInfo& info) {
    if (info.has("stride")) attrs.stride = info.get_ints("stride");
    if (info.has("padding")) attrs.padding = info.get_ints("padding");
    if (info.has("dilation")) attrs.dilation = info.get_ints("dilation");
    attrs.groups = info.get_int("groups", 1);
    attrs.offset_groups = info.get_int("offset_groups", 1);
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
    run<T>(ctx, g, x.as<T>(), w.as<T>(), off.as<T>(), has_bias ? b.as<T>() : nullptr, has_mask ? m.as<T>() : nullptr,
           y);
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
