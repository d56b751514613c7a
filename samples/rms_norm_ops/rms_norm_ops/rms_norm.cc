// custom::rms_norm(x, weight?, epsilon) -> (y, inv_rms): RMS normalization over the last axis.
//
//   inv_rms[r] = 1 / sqrt(mean(x[r, :]^2) + epsilon)       (accumulated in double)
//   y[r, :]    = x[r, :] * inv_rms[r] * weight[:]           (weight optional, shape [D])
//
// float and double; rows are split over ONNX Runtime's intra-op threads when the tensor
// is large. Built by graphkit against its kernel header (graphkit.runtime.native.include_dir()).
#include <cmath>
#include <cstdint>
#include <string>

#include <graphkit/kernel.h>

namespace rms {

constexpr size_t kParallelMin = 1 << 15;  // elements; up to this, run inline
constexpr size_t kChunkElems = 1 << 14;   // about this many elements per parallel task

template <class T, ONNXTensorElementDataType TYPE>
struct RmsNorm {
  static const char* name() { return "rms_norm"; }
  static constexpr ONNXTensorElementDataType inputs[] = {TYPE, TYPE};
  static constexpr ONNXTensorElementDataType outputs[] = {TYPE, TYPE};
  static constexpr size_t required_inputs = 1;  // weight may be omitted

  double epsilon;

  RmsNorm(const gk::Api&, const gk::KernelInfo& info) : epsilon(info.get_float("epsilon", 1e-6f)) {}

  void compute(gk::Context& ctx) {
    const gk::Api& api = ctx.api();
    const gk::TensorView x = ctx.input(0);
    gk::TensorView w;
    const bool has_weight = ctx.optional_input(1, w);
    if (x.type != TYPE) api.fail(ORT_INVALID_ARGUMENT, "unexpected element type of x");
    if (x.shape.empty()) api.fail(ORT_INVALID_ARGUMENT, "x must have at least one dimension, got a scalar");
    const size_t d = size_t(x.shape.back());
    if (has_weight) {
      if (w.type != TYPE) api.fail(ORT_INVALID_ARGUMENT, "weight must have the element type of x");
      if (w.shape.size() != 1 || size_t(w.shape[0]) != d) {
        api.fail(ORT_INVALID_ARGUMENT, "weight must have shape [" + std::to_string(d) + "], got " + gk::shape_str(w.shape));
      }
    }
    gk::Shape inv_shape = x.shape;
    inv_shape.back() = 1;
    T* y = ctx.output<T>(0, x.shape);
    T* inv = ctx.output<T>(1, inv_shape);
    if (d == 0) {  // the mean of no elements is NaN (as in numpy); y is empty
      size_t rows = 1;
      for (size_t k = 0; k + 1 < x.shape.size(); ++k) rows *= size_t(x.shape[k]);
      for (size_t r = 0; r < rows; ++r) inv[r] = T(NAN);
      return;
    }
    const size_t rows = x.size / d;
    const T* px = x.as<T>();
    const T* pw = has_weight ? w.as<T>() : nullptr;
    auto run_rows = [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) {
        const T* xr = px + r * d;
        T* yr = y + r * d;
        double acc = 0;
        for (size_t i = 0; i < d; ++i) acc += double(xr[i]) * double(xr[i]);
        const T s = T(1.0 / std::sqrt(acc / double(d) + epsilon));
        inv[r] = s;
        if (pw != nullptr) {
          for (size_t i = 0; i < d; ++i) yr[i] = xr[i] * s * pw[i];
        } else {
          for (size_t i = 0; i < d; ++i) yr[i] = xr[i] * s;
        }
      }
    };
    if (x.size <= kParallelMin) {
      run_rows(0, rows);
      return;
    }
    const size_t rows_per_task = d >= kChunkElems ? 1 : kChunkElems / d;
    const size_t tasks = (rows + rows_per_task - 1) / rows_per_task;
    ctx.parallel_for(tasks, [&](size_t t) {
      const size_t begin = t * rows_per_task;
      run_rows(begin, begin + rows_per_task < rows ? begin + rows_per_task : rows);
    });
  }

  // y: x's type and shape; inv_rms: x's shape with the last dim 1 (symbolic dims kept).
  static void infer_shapes(gk::ShapeInferContext& ctx) {
    const gk::ShapeInfo x = ctx.input(0);
    if (x.dims.empty()) return;  // unknown rank (or a scalar, which Compute reports)
    ctx.set_output(0, x);
    gk::ShapeInfo inv = x;
    inv.dims.back() = 1;
    inv.symbols.back().clear();
    ctx.set_output(1, inv);
  }
};

}  // namespace rms

GRAPHKIT_OPS(rms_norm,
             gk::make_op<rms::RmsNorm<float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>>(),
             gk::make_op<rms::RmsNorm<double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>>())
