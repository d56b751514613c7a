// deform_conv2d's C++ core, shared by the ONNX Runtime kernel (deform_conv2d.cc) and the
// torch forward (deform_conv2d_torch.cpp). Plain C++17, no ORT or torch types.
//
// The convolution is "sample into columns, then GEMM". Sampling is vectorized over
// channels: the image is first copied channels-last with one extra all-zero pixel, so each
// bilinear corner of a sampling point is a contiguous row of channels (a corner outside the
// image points at the zero pixel, with weight 0), and each column row is a blend of four
// rows. Columns of one weight group are laid out position-major:
//
//     cols[group][p][tap * cin_g + c]      p = oh * Wo + ow, tap = i * kw + j
//
// so the GEMM is out[m][p] = sum_k wt[group][m][k] * cols[group][p][k], with the weight
// repacked to the same k order by the caller.
//
// Rules (torchvision's): point (y, x) = (oh * sh - ph + i * dh + dy, ow * sw - pw + j * dw + dx)
// reads 0 unless -1 < y < H and -1 < x < W; otherwise each of its four neighbours reads 0
// when outside the image. The mask (when given) scales the sample.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace gk {
namespace dcn {

struct Attributes {
  std::vector<int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1, offset_groups = 1;
};

struct Geometry {
  int64_t n = 0, c = 0, h = 0, w = 0;         // input
  int64_t m = 0, cin_g = 0, kh = 0, kw = 0;   // weight
  int64_t ho = 0, wo = 0;                     // output
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t groups = 1, offset_groups = 1;
  bool has_bias = false, has_mask = false;

  int64_t taps() const { return kh * kw; }
  int64_t positions() const { return ho * wo; }
  int64_t group_k() const { return taps() * cin_g; }  // GEMM K of one weight group
  int64_t mg() const { return m / groups; }           // output channels per weight group
  int64_t cg() const { return c / offset_groups; }    // input channels per offset group
};

inline std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Checks the shapes (bias/mask nullptr when absent) against each other and the attributes
// and fills `g`. Returns "" when they fit, else what is wrong (the wording of _shapes.py).
inline std::string check(const Attributes& a, const std::vector<int64_t>& input, const std::vector<int64_t>& weight,
                         const std::vector<int64_t>& offset, const std::vector<int64_t>* bias,
                         const std::vector<int64_t>* mask, Geometry& g) {
  auto rank = [](const char* name, const std::vector<int64_t>& s, size_t r) -> std::string {
    if (s.size() == r) return "";
    return std::string(name) + " must have rank " + std::to_string(r) + ", got shape " + dims_str(s);
  };
  for (auto msg : {rank("input", input, 4), rank("weight", weight, 4), rank("offset", offset, 4),
                   bias ? rank("bias", *bias, 1) : std::string(), mask ? rank("mask", *mask, 4) : std::string()}) {
    if (!msg.empty()) return msg;
  }
  const struct {
    const char* name;
    const std::vector<int64_t>& v;
    int64_t low;
  } lists[] = {{"stride", a.stride, 1}, {"padding", a.padding, 0}, {"dilation", a.dilation, 1}};
  for (const auto& l : lists) {
    if (l.v.size() != 2) return std::string(l.name) + " must hold 2 values (height, width), got " + dims_str(l.v);
    if (l.v[0] < l.low || l.v[1] < l.low)
      return std::string(l.name) + " values must be >= " + std::to_string(l.low) + ", got " + dims_str(l.v);
  }
  if (a.groups < 1) return "groups must be >= 1, got " + std::to_string(a.groups);
  if (a.offset_groups < 1) return "offset_groups must be >= 1, got " + std::to_string(a.offset_groups);
  const int64_t og = a.offset_groups, groups = a.groups;
  g.n = input[0], g.c = input[1], g.h = input[2], g.w = input[3];
  g.m = weight[0], g.cin_g = weight[1], g.kh = weight[2], g.kw = weight[3];
  g.sh = a.stride[0], g.sw = a.stride[1], g.ph = a.padding[0], g.pw = a.padding[1];
  g.dh = a.dilation[0], g.dw = a.dilation[1], g.groups = groups, g.offset_groups = og;
  g.has_bias = bias != nullptr, g.has_mask = mask != nullptr;
  const std::string og_s = std::to_string(og);
  if (g.c % og) return "input has " + std::to_string(g.c) + " channels, not divisible by offset_groups=" + og_s;
  if (g.cin_g * groups != g.c)
    return "weight has " + std::to_string(g.cin_g) + " input channels per group; with groups=" + std::to_string(groups) +
           " the input needs " + std::to_string(g.cin_g * groups) + " channels, it has " + std::to_string(g.c);
  if (g.m % groups)
    return "weight has " + std::to_string(g.m) + " output channels, not divisible by groups=" + std::to_string(groups);
  if (g.cin_g < 1) return "weight in_channels must be >= 1, got " + std::to_string(g.cin_g);
  if (g.kh < 1) return "kernel height must be >= 1, got " + std::to_string(g.kh);
  if (g.kw < 1) return "kernel width must be >= 1, got " + std::to_string(g.kw);
  g.ho = (g.h + 2 * g.ph - (g.dh * (g.kh - 1) + 1)) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - (g.dw * (g.kw - 1) + 1)) / g.sw + 1;
  if (g.h + 2 * g.ph - (g.dh * (g.kh - 1) + 1) < 0) g.ho = 0;  // C++ division truncates toward 0
  if (g.w + 2 * g.pw - (g.dw * (g.kw - 1) + 1) < 0) g.wo = 0;
  if (g.ho < 1 || g.wo < 1)
    return std::string("output ") + (g.ho < 1 ? "height" : "width") + " would be " +
           std::to_string(g.ho < 1 ? g.ho : g.wo) +
           ": the input is smaller than the dilated kernel (input " + dims_str({g.h, g.w}) + ", kernel " +
           dims_str({g.kh, g.kw}) + ", padding " + dims_str(a.padding) + ", dilation " + dims_str(a.dilation) + ")";
  if (g.h * g.w >= (int64_t(1) << 31) - 1)  // pixel indices are 32-bit
    return "input is too large: H * W = " + std::to_string(g.h * g.w) + " must stay below 2^31 - 1";
  // OpenBLAS (scipy-openblas32) takes the GEMM's dimensions as 32-bit ints.
  const int64_t blas_limit = (int64_t(1) << 31) - 1;
  if (g.m / groups > blas_limit || g.ho * g.wo > blas_limit || g.cin_g * g.kh * g.kw > blas_limit)
    return "too large for the GEMM's 32-bit dimensions: output channels per group " + std::to_string(g.m / groups) +
           ", output positions Ho * Wo = " + std::to_string(g.ho * g.wo) + ", C/groups * kh * kw = " +
           std::to_string(g.cin_g * g.kh * g.kw) + " must each stay below 2^31";
  const int64_t kk = g.taps();
  if (offset[1] != 2 * og * kk)
    return "offset has " + std::to_string(offset[1]) + " channels; expected 2 * offset_groups * kh * kw = " +
           std::to_string(2 * og * kk) + " (offset_groups=" + og_s + ", kernel " + std::to_string(g.kh) + "x" +
           std::to_string(g.kw) + ")";
  if (offset[2] != g.ho)
    return "offset height is " + std::to_string(offset[2]) + "; the output height is " + std::to_string(g.ho);
  if (offset[3] != g.wo)
    return "offset width is " + std::to_string(offset[3]) + "; the output width is " + std::to_string(g.wo);
  if (mask) {
    if ((*mask)[1] != og * kk)
      return "mask has " + std::to_string((*mask)[1]) + " channels; expected offset_groups * kh * kw = " +
             std::to_string(og * kk);
    if ((*mask)[2] != g.ho)
      return "mask height is " + std::to_string((*mask)[2]) + "; the output height is " + std::to_string(g.ho);
    if ((*mask)[3] != g.wo)
      return "mask width is " + std::to_string((*mask)[3]) + "; the output width is " + std::to_string(g.wo);
  }
  if (offset[0] != g.n || (mask && (*mask)[0] != g.n)) {
    std::string s = "batch sizes differ: input " + std::to_string(g.n) + ", offset " + std::to_string(offset[0]);
    if (mask) s += ", mask " + std::to_string((*mask)[0]);
    return s;
  }
  if (bias && (*bias)[0] != g.m)
    return "bias has " + std::to_string((*bias)[0]) + " values; the weight has " + std::to_string(g.m) +
           " output channels";
  return "";
}

// Copies the pixels [p0, p1) x channels [c0, c1) of a (C, H * W) image to channels-last
// `pixels` ((H * W + 1) x C), in blocks whose rows stay in L1.
template <class T>
void to_channels_last_scalar(const Geometry& g, const T* image, T* pixels, int64_t p0, int64_t p1, int64_t c0,
                             int64_t c1) {
  const int64_t hw = g.h * g.w, c = g.c;
  constexpr int64_t kBlock = 32;
  for (int64_t b0 = p0; b0 < p1; b0 += kBlock) {
    const int64_t b1 = std::min(b0 + kBlock, p1);
    for (int64_t ch = c0; ch < c1; ++ch) {
      const T* src = image + ch * hw;
      for (int64_t p = b0; p < b1; ++p) pixels[p * c + ch] = src[p];
    }
  }
}

// Copies image rows [y0, y1) (C, H, W) to channels-last `pixels` ((H * W + 1) x C; the
// caller zeroes the last pixel once).
template <class T>
void to_channels_last(const Geometry& g, const T* image, T* pixels, int64_t y0, int64_t y1) {
  to_channels_last_scalar(g, image, pixels, y0 * g.w, y1 * g.w, 0, g.c);
}

#if defined(__AVX512F__)
// dst[j * ldd + i] = src[i * lds + j] for a 16 x 16 block of floats.
inline void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4)
    for (int j = 0; j < 2; ++j) {
      const __m512d a = _mm512_castps_pd(t[i + j]), b = _mm512_castps_pd(t[i + j + 2]);
      r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + k * ldd, r[k]);
}

// float with AVX-512: 16 x 16 blocks transposed in registers, the edges scalar.
template <>
inline void to_channels_last<float>(const Geometry& g, const float* image, float* pixels, int64_t y0, int64_t y1) {
  const int64_t hw = g.h * g.w, c = g.c, p0 = y0 * g.w, p1 = y1 * g.w;
  const int64_t c16 = c / 16 * 16, p16 = p0 + (p1 - p0) / 16 * 16;
  for (int64_t p = p0; p < p16; p += 16)
    for (int64_t ch = 0; ch < c16; ch += 16) transpose16(image + ch * hw + p, hw, pixels + p * c + ch, c);
  if (c16 < c) to_channels_last_scalar(g, image, pixels, p0, p16, c16, c);
  if (p16 < p1) to_channels_last_scalar(g, image, pixels, p16, p1, 0, c);
}
#endif

// dst[i] = w00 * a[i] + w01 * b[i] + w10 * c[i] + w11 * d[i] over one run of channels.
template <class T>
inline void blend(T* __restrict dst, const T* __restrict a, const T* __restrict b, const T* __restrict c,
                  const T* __restrict d, T w00, T w01, T w10, T w11, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = w00 * a[i] + w01 * b[i] + w10 * c[i] + w11 * d[i];
}

#if defined(__AVX512F__)
// float with AVX-512: 64 channels per step (four independent vectors), then 16, then the
// tail under a mask (no scalar loop).
struct Blend16 {
  __m512 w00, w01, w10, w11;
  __m512 operator()(__m512 a, __m512 b, __m512 c, __m512 d) const {
    return _mm512_fmadd_ps(w11, d, _mm512_fmadd_ps(w10, c, _mm512_fmadd_ps(w01, b, _mm512_mul_ps(w00, a))));
  }
};

template <>
inline void blend<float>(float* __restrict dst, const float* __restrict a, const float* __restrict b,
                         const float* __restrict c, const float* __restrict d, float w00, float w01, float w10,
                         float w11, int64_t n) {
  const Blend16 f{_mm512_set1_ps(w00), _mm512_set1_ps(w01), _mm512_set1_ps(w10), _mm512_set1_ps(w11)};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
#pragma GCC unroll 4
    for (int v = 0; v < 64; v += 16) {
      _mm512_storeu_ps(dst + i + v, f(_mm512_loadu_ps(a + i + v), _mm512_loadu_ps(b + i + v),
                                      _mm512_loadu_ps(c + i + v), _mm512_loadu_ps(d + i + v)));
    }
  }
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, f(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), _mm512_loadu_ps(c + i),
                                _mm512_loadu_ps(d + i)));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(dst + i, m, f(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                                        _mm512_maskz_loadu_ps(m, c + i), _mm512_maskz_loadu_ps(m, d + i)));
  }
}
#endif

// The channels [begin, end) of one offset group that fall in weight group `group`, written
// at column element `column` (+ tap * cin_g) of that group's rows.
struct ChannelRun {
  int64_t begin, end, group, column;
};

// The bilinear corners of one tap for a run of positions q (structure of arrays): pixel
// indices i0..i3 into the channels-last image (the zero pixel H * W for a corner outside)
// and weights w0..w3 (0 for a corner outside, the mask folded in; nullptr mask: 1). The
// base points are (by[q] + ty, bx[q] + tx) (integral), the offsets dy[q], dx[q]. Returns
// false when a mask value is infinite or NaN (the weights are then not torchvision's: see sample).
template <class T>
struct Corners {
  int32_t* i[4];
  T* w[4];
};

template <class T>
bool corners_scalar(const Geometry& g, const T* by, const T* bx, T ty, T tx, const T* dy, const T* dx,
                    const T* mask, int64_t begin, int64_t count, const Corners<T>& out) {
  const T fh = T(g.h), fw = T(g.w);
  bool finite = true;
  const int32_t width = int32_t(g.w), height = int32_t(g.h), none = int32_t(g.h * g.w);
  for (int64_t q = begin; q < count; ++q) {
    const T y = (by[q] + ty) + dy[q], x = (bx[q] + tx) + dx[q];
    int32_t idx[4] = {none, none, none, none};
    T w[4] = {0, 0, 0, 0};
    if (y > T(-1) && y < fh && x > T(-1) && x < fw) {  // false for NaN
      const T yf = std::floor(y), xf = std::floor(x);
      const int32_t iy = int32_t(yf), ix = int32_t(xf);
      const T ly = y - yf, lx = x - xf, hy = T(1) - ly, hx = T(1) - lx;
      const T scale = mask ? mask[q] : T(1);
      const bool y0 = iy >= 0, y1 = iy + 1 < height, x0 = ix >= 0, x1 = ix + 1 < width;
      const int32_t base = iy * width + ix;
      if (y0 && x0) idx[0] = base, w[0] = hy * hx * scale;
      if (y0 && x1) idx[1] = base + 1, w[1] = hy * lx * scale;
      if (y1 && x0) idx[2] = base + width, w[2] = ly * hx * scale;
      if (y1 && x1) idx[3] = base + width + 1, w[3] = ly * lx * scale;
    }
    for (int k = 0; k < 4; ++k) out.i[k][q] = idx[k], out.w[k][q] = w[k];
    if (mask) finite &= std::fabs(mask[q]) <= std::numeric_limits<T>::max();  // false for NaN
  }
  return finite;
}

template <class T>
bool corners(const Geometry& g, const T* by, const T* bx, T ty, T tx, const T* dy, const T* dx, const T* mask,
             int64_t count, const Corners<T>& out) {
  return corners_scalar(g, by, bx, ty, tx, dy, dx, mask, 0, count, out);
}

#if defined(__AVX512F__)
// float with AVX-512: 16 positions per step (same arithmetic as corners_scalar), the rest scalar.
template <>
inline bool corners<float>(const Geometry& g, const float* by, const float* bx, float ty, float tx, const float* dy,
                           const float* dx, const float* mask, int64_t count, const Corners<float>& out) {
  const __m512 vty = _mm512_set1_ps(ty), vtx = _mm512_set1_ps(tx), one = _mm512_set1_ps(1.0f);
  const __m512 fh = _mm512_set1_ps(float(g.h)), fw = _mm512_set1_ps(float(g.w)), minus_one = _mm512_set1_ps(-1.0f);
  const __m512i width = _mm512_set1_epi32(int32_t(g.w)), height = _mm512_set1_epi32(int32_t(g.h));
  const __m512i none = _mm512_set1_epi32(int32_t(g.h * g.w)), zero_i = _mm512_setzero_si512();
  const __m512i one_i = _mm512_set1_epi32(1);
  const __m512 max = _mm512_set1_ps(std::numeric_limits<float>::max());
  __mmask16 finite = 0xFFFF;
  int64_t q = 0;
  for (; q + 16 <= count; q += 16) {
    const __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(by + q), vty), _mm512_loadu_ps(dy + q));
    const __m512 x = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(bx + q), vtx), _mm512_loadu_ps(dx + q));
    const __mmask16 inside = _mm512_cmp_ps_mask(y, minus_one, _CMP_GT_OQ) & _mm512_cmp_ps_mask(y, fh, _CMP_LT_OQ) &
                             _mm512_cmp_ps_mask(x, minus_one, _CMP_GT_OQ) & _mm512_cmp_ps_mask(x, fw, _CMP_LT_OQ);
    const __m512 yc = _mm512_maskz_mov_ps(inside, y), xc = _mm512_maskz_mov_ps(inside, x);
    const __m512 yf = _mm512_roundscale_ps(yc, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 xf = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512i iy = _mm512_cvttps_epi32(yf), ix = _mm512_cvttps_epi32(xf);
    const __m512 ly = _mm512_sub_ps(yc, yf), lx = _mm512_sub_ps(xc, xf);
    const __m512 hy = _mm512_sub_ps(one, ly), hx = _mm512_sub_ps(one, lx);
    __m512 scale = _mm512_maskz_mov_ps(inside, one);
    if (mask) {
      const __m512 m = _mm512_loadu_ps(mask + q);
      finite &= _mm512_cmp_ps_mask(_mm512_abs_ps(m), max, _CMP_LE_OQ);  // false for inf and NaN
      scale = _mm512_maskz_mov_ps(inside, m);
    }
    const __mmask16 y0 = inside & _mm512_cmpge_epi32_mask(iy, zero_i);
    const __mmask16 y1 = inside & _mm512_cmplt_epi32_mask(_mm512_add_epi32(iy, one_i), height);
    const __mmask16 x0 = _mm512_cmpge_epi32_mask(ix, zero_i);
    const __mmask16 x1 = _mm512_cmplt_epi32_mask(_mm512_add_epi32(ix, one_i), width);
    const __m512i base = _mm512_add_epi32(_mm512_mullo_epi32(iy, width), ix);
    _mm512_storeu_si512(out.i[0] + q, _mm512_mask_mov_epi32(none, y0 & x0, base));
    _mm512_storeu_si512(out.i[1] + q, _mm512_mask_mov_epi32(none, y0 & x1, _mm512_add_epi32(base, one_i)));
    _mm512_storeu_si512(out.i[2] + q, _mm512_mask_mov_epi32(none, y1 & x0, _mm512_add_epi32(base, width)));
    _mm512_storeu_si512(out.i[3] + q,
                        _mm512_mask_mov_epi32(none, y1 & x1, _mm512_add_epi32(_mm512_add_epi32(base, width), one_i)));
    _mm512_storeu_ps(out.w[0] + q, _mm512_maskz_mul_ps(y0 & x0, _mm512_mul_ps(hy, hx), scale));
    _mm512_storeu_ps(out.w[1] + q, _mm512_maskz_mul_ps(y0 & x1, _mm512_mul_ps(hy, lx), scale));
    _mm512_storeu_ps(out.w[2] + q, _mm512_maskz_mul_ps(y1 & x0, _mm512_mul_ps(ly, hx), scale));
    _mm512_storeu_ps(out.w[3] + q, _mm512_maskz_mul_ps(y1 & x1, _mm512_mul_ps(ly, lx), scale));
  }
  return corners_scalar(g, by, bx, ty, tx, dy, dx, mask, q, count, out) && finite == 0xFFFF;
}
#endif

// Columns of positions [p0, p1) of one image: position p of weight group gw goes to row
// cols + gw * group_stride + (p - p0) * ld (see the layout above). `pixels` comes from
// to_channels_last; `offset` and `mask` (nullptr when absent) point at this image.
//
// Per offset group, the corners of every tap and position are computed first (vectorized
// over positions), then each position's column row is filled, one blend per tap and channel run.
// The mask is folded into the corner weights; where it is infinite or NaN (corners reports
// it, no extra pass) it multiplies the blended sample instead, as torchvision's
// mask * sample does: mask * 0 = NaN at a point outside the image, not a skipped tap.
template <class T>
void sample(const Geometry& g, const T* pixels, const T* offset, const T* mask, int64_t p0, int64_t p1, T* cols,
            int64_t ld, int64_t group_stride) {
  const int64_t np = g.positions(), kk = g.taps(), c = g.c, cg = g.cg(), cin_g = g.cin_g, count = p1 - p0;
  if (count <= 0) return;
  // Each offset group's channels, split where they cross a weight group boundary.
  std::vector<std::vector<ChannelRun>> runs(size_t(g.offset_groups));
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    for (int64_t ch = og * cg, end = (og + 1) * cg; ch < end;) {
      const int64_t gw = ch / cin_g, run_end = std::min(end, (gw + 1) * cin_g);
      runs[size_t(og)].push_back({ch, run_end, gw, gw * group_stride + (ch - gw * cin_g)});
      ch = run_end;
    }
  }
  // Scratch: base points, and the corners of every (tap, position) of one offset group.
  thread_local std::vector<T> real;
  thread_local std::vector<int32_t> ints;
  real.resize(size_t((2 + 4 * kk) * count));
  ints.resize(size_t(4 * kk * count));
  T* by = real.data();
  T* bx = by + count;
  auto tap = [&](int64_t t) {
    Corners<T> k;
    for (int i = 0; i < 4; ++i) k.w[i] = bx + count * (1 + 4 * t + i), k.i[i] = ints.data() + count * (4 * t + i);
    return k;
  };
  for (int64_t q = 0, p = p0; q < count; ++q, ++p) {
    by[q] = T((p / g.wo) * g.sh - g.ph);
    bx[q] = T((p % g.wo) * g.sw - g.pw);
  }
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    const std::vector<ChannelRun>& og_runs = runs[size_t(og)];
    const bool single = og_runs.size() == 1;
    const int64_t begin = og_runs[0].begin, column = og_runs[0].column, length = og_runs[0].end - begin;
    const T* og_mask = mask ? mask + og * kk * np + p0 : nullptr;  // tap t at og_mask + t * np
    bool fold = true;
    for (int64_t t = 0; t < kk; ++t) {
      const T* dy = offset + (og * 2 * kk + 2 * t) * np + p0;
      fold &= corners(g, by, bx, T((t / g.kw) * g.dh), T((t % g.kw) * g.dw), dy, dy + np,
                      og_mask ? og_mask + t * np : nullptr, count, tap(t));
    }
    for (int64_t t = 0; !fold && t < kk; ++t) {  // slow path: the corners without the mask
      const T* dy = offset + (og * 2 * kk + 2 * t) * np + p0;
      corners(g, by, bx, T((t / g.kw) * g.dh), T((t % g.kw) * g.dw), dy, dy + np, static_cast<const T*>(nullptr),
              count, tap(t));
    }
    // Position by position: each column row is written front to back while it is in L1.
    for (int64_t q = 0; q < count; ++q) {
      T* row = cols + q * ld;
      for (int64_t t = 0; t < kk; ++t) {
        const Corners<T> k = tap(t);
        const T* r0 = pixels + int64_t(k.i[0][q]) * c;
        const T* r1 = pixels + int64_t(k.i[1][q]) * c;
        const T* r2 = pixels + int64_t(k.i[2][q]) * c;
        const T* r3 = pixels + int64_t(k.i[3][q]) * c;
        const T w0 = k.w[0][q], w1 = k.w[1][q], w2 = k.w[2][q], w3 = k.w[3][q];
        T* dst = row + t * cin_g;
        if (single) {  // the usual case: one run (hoisted out of the loop)
          blend(dst + column, r0 + begin, r1 + begin, r2 + begin, r3 + begin, w0, w1, w2, w3, length);
          continue;
        }
        for (const ChannelRun& r : og_runs) {
          blend(dst + r.column, r0 + r.begin, r1 + r.begin, r2 + r.begin, r3 + r.begin, w0, w1, w2, w3,
                r.end - r.begin);
        }
      }
    }
    if (fold) continue;
    for (int64_t q = 0; q < count; ++q) {  // slow path: a non-finite mask multiplies the samples
      for (int64_t t = 0; t < kk; ++t) {
        const T m = og_mask[t * np + q];
        T* dst = cols + q * ld + t * cin_g;
        for (const ChannelRun& r : og_runs) {
          for (int64_t i = r.column; i < r.column + (r.end - r.begin); ++i) dst[i] *= m;
        }
      }
    }
  }
}

}  // namespace dcn
}  // namespace gk
