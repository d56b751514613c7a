// my_add(a, b) = 2 * a + b, with numpy/ONNX multidirectional broadcasting,
// for float16, float and double (one OrtCustomOp per type, same op name).
//
// Same shapes: one vectorized pass over memory. Broadcasting: the two index spaces
// are collapsed to the fewest dims, and the innermost contiguous run is done by
// one of four vector loops (a and b both contiguous, or either one a scalar).
// More than kParallelMin output elements: split into chunks over ORT's intra-op
// thread pool (KernelContext_ParallelFor); otherwise inline.
#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <graphkit/kernel.h>

namespace gk {
namespace {

#ifndef GK_MY_ADD_PARALLEL_MIN
#define GK_MY_ADD_PARALLEL_MIN (1 << 16)
#endif
#ifndef GK_MY_ADD_CHUNK
#define GK_MY_ADD_CHUNK (1 << 15)
#endif
constexpr size_t kParallelMin = GK_MY_ADD_PARALLEL_MIN;  // elements; up to this, run inline
constexpr size_t kChunk = GK_MY_ADD_CHUNK;               // elements per parallel task

// ---- float16 ------------------------------------------------------------------------

struct Half {
  uint16_t bits;
};
static_assert(sizeof(Half) == 2, "float16 is two bytes");

#if defined(__F16C__)
inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t float_to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#else
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// IEEE binary16 <-> binary32, round to nearest even; handles subnormals, inf, NaN.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {                                                         // zero / subnormal
    const float mag = float(man) * 5.9604644775390625e-08f;               // man * 2^-24
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}
inline uint16_t float_to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  if (au >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (au > 0x7f800000u ? 0x200u : 0u));  // inf / NaN
  if (au >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow to inf
  if (au < 0x38800000u) {                                  // below 2^-14: subnormal half (or zero)
    // magic-number trick: add 0.5 so the FPU rounds the mantissa to nearest even.
    const float r = bits_float(au) + 0.5f;
    return uint16_t(sign | uint16_t(float_bits(r) - 0x3f000000u));
  }
  const uint32_t mant_odd = (au >> 13) & 1u;
  uint32_t v = au + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round half to even
  return uint16_t(sign | uint16_t(v >> 13));
}
#endif

// ---- inner loops: y[i] = 2 * a[i] + b[i] over one contiguous run ----------------------
// `__restrict` + -O3 lets gcc vectorize the float/double loops; the output never
// aliases an input (the op declares no in-place outputs). 2a is written a + a: exact like
// torch's 2 * a, and never contracted into an fma (which would not overflow where torch's
// 2 * a does: my_add(max, -inf) is NaN in torch, -inf with an fma).

template <class T>
struct Loops {
  static void both(const T* __restrict a, const T* __restrict b, T* __restrict y, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] = (a[i] + a[i]) + b[i];
  }
  static void scalar_b(const T* __restrict a, T b, T* __restrict y, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] = (a[i] + a[i]) + b;
  }
  static void scalar_a(T a, const T* __restrict b, T* __restrict y, size_t n) {
    const T a2 = a + a;
    for (size_t i = 0; i < n; ++i) y[i] = a2 + b[i];
  }
  static void fill(T a, T b, T* __restrict y, size_t n) { std::fill(y, y + n, (a + a) + b); }
};

template <>
struct Loops<Half> {
  // Computed in float, rounded to half after 2a and after the sum, as torch and numpy
  // round each float16 op (2a overflows at |a| > 32752: my_add(65504, -65504) is inf).
  static float twice(float f) { return half_to_float(float_to_half(f + f)); }
#if defined(__F16C__)
  static __m256 twice(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_add_ps(v, v), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  static void both(const Half* __restrict a, const Half* __restrict b, Half* __restrict y, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m256 va = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
      const __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
      const __m256 r = _mm256_add_ps(twice(va), vb);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; ++i) {
      const float fa = half_to_float(a[i].bits);
      y[i].bits = float_to_half(twice(fa) + half_to_float(b[i].bits));
    }
  }
  static void scalar_b(const Half* __restrict a, Half b, Half* __restrict y, size_t n) {
    const float fb = half_to_float(b.bits);
    size_t i = 0;
#if defined(__F16C__)
    const __m256 vb = _mm256_set1_ps(fb);
    for (; i + 8 <= n; i += 8) {
      const __m256 va = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
      const __m256 r = _mm256_add_ps(twice(va), vb);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; ++i) {
      const float fa = half_to_float(a[i].bits);
      y[i].bits = float_to_half(twice(fa) + fb);
    }
  }
  static void scalar_a(Half a, const Half* __restrict b, Half* __restrict y, size_t n) {
    const float fa = half_to_float(a.bits);
    const float a2 = twice(fa);
    size_t i = 0;
#if defined(__F16C__)
    const __m256 va2 = _mm256_set1_ps(a2);
    for (; i + 8 <= n; i += 8) {
      const __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                       _mm256_cvtps_ph(_mm256_add_ps(va2, vb), _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; ++i) y[i].bits = float_to_half(a2 + half_to_float(b[i].bits));
  }
  static void fill(Half a, Half b, Half* __restrict y, size_t n) {
    const float fa = half_to_float(a.bits);
    const Half v{float_to_half(twice(fa) + half_to_float(b.bits))};
    std::fill(y, y + n, v);
  }
};

// ---- broadcasting plan ----------------------------------------------------------------

// The output index space collapsed to the fewest dims: dims[k] with element strides
// sa[k], sb[k] into a and b (0 where that input is broadcast). dims.back() is the
// innermost run.
struct Plan {
  Shape out;  // the full output shape
  size_t total = 0;
  std::vector<int64_t> dims, sa, sb;
};

// Fills plan.out; returns false if the shapes do not broadcast.
bool broadcast_shape(const Shape& a, const Shape& b, Shape& out) {
  const size_t rank = std::max(a.size(), b.size());
  out.assign(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da == db || db == 1) {
      out[i] = da;
    } else if (da == 1) {
      out[i] = db;
    } else {
      return false;
    }
  }
  return true;
}

void make_plan(const Shape& a, const Shape& b, Plan& p) {
  const size_t rank = p.out.size();
  p.total = 1;
  for (int64_t d : p.out) p.total *= size_t(d);
  // (size, a broadcast?, b broadcast?) per dim, dims of size 1 dropped, runs merged.
  struct Dim {
    int64_t size;
    bool ba, bb;
  };
  std::vector<Dim> ds;
  for (size_t i = 0; i < rank; ++i) {
    if (p.out[i] == 1) continue;
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    const bool ba = da == 1, bb = db == 1;
    if (!ds.empty() && ds.back().ba == ba && ds.back().bb == bb) {
      ds.back().size *= p.out[i];
    } else {
      ds.push_back({p.out[i], ba, bb});
    }
  }
  if (ds.empty()) ds.push_back({1, true, true});  // a single element
  const size_t n = ds.size();
  p.dims.resize(n);
  p.sa.resize(n);
  p.sb.resize(n);
  int64_t stride_a = 1, stride_b = 1;
  for (size_t k = n; k-- > 0;) {
    p.dims[k] = ds[k].size;
    p.sa[k] = ds[k].ba ? 0 : stride_a;
    p.sb[k] = ds[k].bb ? 0 : stride_b;
    if (!ds[k].ba) stride_a *= ds[k].size;
    if (!ds[k].bb) stride_b *= ds[k].size;
  }
}

template <class T>
inline void run_inner(const T* a, int64_t sa, const T* b, int64_t sb, T* y, size_t n) {
  if (sa && sb) {
    Loops<T>::both(a, b, y, n);
  } else if (sa) {
    Loops<T>::scalar_b(a, *b, y, n);
  } else if (sb) {
    Loops<T>::scalar_a(*a, b, y, n);
  } else {
    Loops<T>::fill(*a, *b, y, n);
  }
}

// Output elements [begin, end) of a broadcasting plan.
template <class T>
void run_range(const Plan& p, const T* a, const T* b, T* y, size_t begin, size_t end) {
  const size_t nd = p.dims.size();
  const size_t inner = size_t(p.dims[nd - 1]);
  const int64_t isa = p.sa[nd - 1], isb = p.sb[nd - 1];
  // Multi-index of `begin` and the matching input offsets.
  int64_t idx[64];
  std::vector<int64_t> big;
  int64_t* ix = idx;
  if (nd > 64) {
    big.resize(nd);
    ix = big.data();
  }
  int64_t oa = 0, ob = 0;
  size_t rest = begin;
  for (size_t k = nd; k-- > 0;) {
    ix[k] = int64_t(rest % size_t(p.dims[k]));
    rest /= size_t(p.dims[k]);
    oa += ix[k] * p.sa[k];
    ob += ix[k] * p.sb[k];
  }
  size_t pos = begin;
  while (pos < end) {
    const size_t run = std::min(inner - size_t(ix[nd - 1]), end - pos);
    run_inner<T>(a + oa, isa, b + ob, isb, y + pos, run);
    pos += run;
    if (pos >= end) break;
    // Next run starts at inner index 0 of the next outer index (odometer carry).
    oa -= ix[nd - 1] * isa;
    ob -= ix[nd - 1] * isb;
    ix[nd - 1] = 0;
    for (size_t k = nd - 1; k-- > 0;) {
      ++ix[k];
      oa += p.sa[k];
      ob += p.sb[k];
      if (ix[k] < p.dims[k]) break;
      oa -= ix[k] * p.sa[k];
      ob -= ix[k] * p.sb[k];
      ix[k] = 0;
    }
  }
}

// Splits [0, total) into chunks: inline when small, else on ORT's thread pool.
template <class F>
void for_chunks(Context& ctx, size_t total, F&& body) {
  if (total <= kParallelMin) {
    body(size_t{0}, total);
    return;
  }
  const size_t chunks = (total + kChunk - 1) / kChunk;
  ctx.parallel_for(chunks, [&](size_t c) {
    const size_t begin = c * kChunk;
    body(begin, std::min(total, begin + kChunk));
  });
}

template <class T, ONNXTensorElementDataType TYPE>
struct MyAdd {
  static const char* name() { return "my_add"; }
  static constexpr ONNXTensorElementDataType inputs[] = {TYPE, TYPE};
  static constexpr ONNXTensorElementDataType outputs[] = {TYPE};

  MyAdd(const Api&, const KernelInfo&) {}

  void compute(Context& ctx) {
    const TensorView a = ctx.input(0);
    const TensorView b = ctx.input(1);
    const Api& api = ctx.api();
    if (a.type != TYPE || b.type != TYPE) api.fail(ORT_INVALID_ARGUMENT, "unexpected input element types");
    const T* pa = a.as<T>();
    const T* pb = b.as<T>();

    if (a.shape == b.shape) {  // the common case: one pass over memory
      T* y = ctx.output<T>(0, a.shape);
      for_chunks(ctx, a.size, [&](size_t begin, size_t end) {
        Loops<T>::both(pa + begin, pb + begin, y + begin, end - begin);
      });
      return;
    }
    Plan plan;
    if (!broadcast_shape(a.shape, b.shape, plan.out)) {
      api.fail(ORT_INVALID_ARGUMENT, "inputs have incompatible shapes " + shape_str(a.shape) + " and " +
                                         shape_str(b.shape) + " (they must be equal or 1 in each trailing dim)");
    }
    make_plan(a.shape, b.shape, plan);
    T* y = ctx.output<T>(0, plan.out);
    if (plan.total == 0) return;
    for_chunks(ctx, plan.total, [&](size_t begin, size_t end) { run_range<T>(plan, pa, pb, y, begin, end); });
  }

  // Output: the inputs' element type and their broadcast shape. Symbolic dims are
  // kept when they decide the result; if a dim cannot be determined (e.g. "N" vs
  // "M", a rank-0 input) or the shapes clash, the output shape is left unset (ORT
  // still knows the type) and Compute reports any clash at run time.
  static void infer_shapes(ShapeInferContext& ctx) {
    const ShapeInfo a = ctx.input(0);
    const ShapeInfo b = ctx.input(1);
    // ORT reports an input of unknown rank as rank 0, indistinguishable from a scalar:
    // rather than guess, leave the output shape unset.
    if (a.dims.empty() || b.dims.empty()) return;
    ShapeInfo out;
    out.type = a.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED ? a.type : b.type;
    const size_t rank = std::max(a.dims.size(), b.dims.size());
    out.dims.assign(rank, 1);
    out.symbols.assign(rank, std::string());
    bool known = true;
    for (size_t i = 0; i < rank && known; ++i) {
      const bool in_a = i >= rank - a.dims.size(), in_b = i >= rank - b.dims.size();
      const size_t ia = in_a ? i - (rank - a.dims.size()) : 0, ib = in_b ? i - (rank - b.dims.size()) : 0;
      const int64_t va = in_a ? a.dims[ia] : 1, vb = in_b ? b.dims[ib] : 1;
      const std::string sa = in_a ? a.symbols[ia] : std::string(), sb = in_b ? b.symbols[ib] : std::string();
      auto take_a = [&] { out.dims[i] = va, out.symbols[i] = sa; };
      auto take_b = [&] { out.dims[i] = vb, out.symbols[i] = sb; };
      if (va >= 0 && vb >= 0) {
        if (va == vb || vb == 1) {
          take_a();
        } else if (va == 1) {
          take_b();
        } else {
          known = false;  // incompatible: Compute names both shapes
        }
      } else if (va == 1) {
        take_b();
      } else if (vb == 1) {
        take_a();
      } else if (va >= 0) {
        take_a();  // b must be va (or 1)
      } else if (vb >= 0) {
        take_b();
      } else if (!sa.empty() && sa == sb) {
        take_a();
      } else {
        known = false;  // "N" vs "M", or an unnamed dim: not expressible
      }
      if (known && out.dims[i] < 0 && out.symbols[i].empty()) known = false;
    }
    if (known) ctx.set_output(0, out);
  }
};

}  // namespace
}  // namespace gk

GRAPHKIT_OPS(my_add,
             gk::make_op<gk::MyAdd<gk::Half, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>>(),
             gk::make_op<gk::MyAdd<float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>>(),
             gk::make_op<gk::MyAdd<double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>>())
