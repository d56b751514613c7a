// graphkit's public C++ kernel header: `#include <graphkit/kernel.h>`
// (graphkit compiles op packages' sources with -I graphkit.runtime.native.include_dir()).
//
// A kernel is a struct K with
//   static const char* name();                               the op type
//   static constexpr ONNXTensorElementDataType inputs[]  = {...};
//   static constexpr ONNXTensorElementDataType outputs[] = {...};
//   K(const gk::Api& api, const gk::KernelInfo& info);       may throw gk::Error
//   void compute(gk::Context& ctx);                          may throw gk::Error
//   static void infer_shapes(gk::ShapeInferContext& ctx);    optional (output shapes)
//   static constexpr size_t required_inputs = N;             optional: inputs from N on
//                                                            may be omitted by a node
// and `gk::make_op<K>()` turns it into an OrtCustomOp. Each op of a package is declared,
// at global scope, once, with all its OrtCustomOps (one per element type):
//   GRAPHKIT_OPS(my_op, gk::make_op<MyOp<float>>(), gk::make_op<MyOp<double>>())
// graphkit generates the registration (which domains, which ops) when it links the
// library; a package never writes RegisterCustomOps. Every callback ORT can reach
// is filled in, and every C++ exception is caught at the ABI boundary: V2 callbacks
// hand errors back to ORT as an OrtStatus (a Python exception), never a crash.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "graphkit/ort_abi.h"

namespace gk {

// The OrtApi version requested from ORT and declared by every OrtCustomOp.
// 17 is the lowest with everything used here: CreateKernelV2/KernelComputeV2 (16),
// InferOutputShapeFn, Get{Start,End}Version and the ShapeInferContext_* slots
// 267-271 and KernelContext_ParallelFor 274 (all 17). ORT >= 1.17 serves it.
constexpr uint32_t kOrtApiVersion = 17;

using Shape = std::vector<int64_t>;

// "[2,3]"; "[]" for a scalar.
std::string shape_str(const int64_t* dims, size_t rank);
inline std::string shape_str(const Shape& s) { return shape_str(s.data(), s.size()); }

// A failure inside a kernel: becomes an OrtStatus with this code and message.
class Error : public std::exception {
 public:
  Error(OrtErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  OrtErrorCode code() const noexcept { return code_; }

 private:
  OrtErrorCode code_;
  std::string message_;
};

// The OrtApi table plus the op name that prefixes every message: "[my_add] ...".
class Api {
 public:
  Api(const OrtApi* api, const char* op) : api_(api), op_(op) {}
  const OrtApi* raw() const { return api_; }
  const char* op() const { return op_; }

  std::string prefixed(const std::string& message) const { return std::string("[") + op_ + "] " + message; }
  // A new status "[op] message" (for returning to ORT).
  OrtStatus* status(OrtErrorCode code, const std::string& message) const {
    return ort::CreateStatus(api_)(code, prefixed(message).c_str());
  }
  // Throw Error("[op] message").
  [[noreturn]] void fail(OrtErrorCode code, const std::string& message) const { throw Error(code, prefixed(message)); }
  // Throw if an ORT call failed ("[op] <what>: <ORT's message>"); releases the status.
  void check(OrtStatus* s, const char* what) const {
    if (s == nullptr) return;
    OrtErrorCode code = ort::GetErrorCode(api_)(s);
    std::string message = std::string(what) + ": " + ort::GetErrorMessage(api_)(s);
    ort::ReleaseStatus(api_)(s);
    fail(code == ORT_OK ? ORT_FAIL : code, message);
  }

 private:
  const OrtApi* api_;
  const char* op_;
};

// A read-only view of an input tensor.
struct TensorView {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Shape shape;
  size_t size = 0;  // element count
  const void* data = nullptr;
  template <class T>
  const T* as() const { return static_cast<const T*>(data); }
};

// Reads node attributes at kernel creation (valid only during the kernel's constructor:
// copy the values out, do not keep the KernelInfo).
class KernelInfo {
 public:
  KernelInfo(const Api& api, const OrtKernelInfo* info) : api_(api), info_(info) {}
  const OrtKernelInfo* raw() const { return info_; }

  bool has(const char* name) const;  // true if an int, float, string or list attribute exists
  int64_t get_int(const char* name) const;
  int64_t get_int(const char* name, int64_t fallback) const;
  float get_float(const char* name) const;
  float get_float(const char* name, float fallback) const;
  std::string get_string(const char* name) const;
  std::string get_string(const char* name, const std::string& fallback) const;
  std::vector<int64_t> get_ints(const char* name) const;
  std::vector<float> get_floats(const char* name) const;
  // Input `index` when the graph holds it as a constant initializer, so that a kernel
  // can prepare it once (e.g. repack a weight); false for a graph input, a computed
  // value or a missing input. The view is valid only during the constructor.
  bool constant_input(size_t index, TensorView& out) const;

 private:
  // Calls `fn` and returns true if ORT found the attribute (status released either way).
  template <class F>
  bool try_get(F&& fn) const {
    OrtStatus* s = fn();
    if (s == nullptr) return true;
    ort::ReleaseStatus(api_.raw())(s);
    return false;
  }
  const Api& api_;
  const OrtKernelInfo* info_;
};

// Number of KernelContext_ParallelFor calls that returned OK (for tests and benchmarks).
extern std::atomic<uint64_t> g_parallel_for_calls;

// One Compute call: inputs, output allocation, ORT's intra-op thread pool.
class Context {
 public:
  Context(const Api& api, OrtKernelContext* ctx) : api_(api), ctx_(ctx) {}
  const Api& api() const { return api_; }
  OrtKernelContext* raw() const { return ctx_; }

  size_t input_count() const;
  size_t output_count() const;
  TensorView input(size_t index) const;
  // Optional input `index`: false when the node omits it (or has fewer inputs).
  bool optional_input(size_t index, TensorView& out) const;
  // Allocates output `index` with `shape`; returns its data (nullptr when it is empty).
  void* output(size_t index, const Shape& shape) const;
  template <class T>
  T* output(size_t index, const Shape& shape) const { return static_cast<T*>(output(index, shape)); }

  // Runs fn(i) for i in [0, total) on ORT's intra-op threads (the caller joins in;
  // one call per i, order unspecified). With total <= 1 it runs inline. The first
  // exception thrown by fn is rethrown here after all calls finish.
  template <class F>
  void parallel_for(size_t total, F&& fn) const;

 private:
  const Api& api_;
  OrtKernelContext* ctx_;
};

template <class F>
void Context::parallel_for(size_t total, F&& fn) const {
  if (total == 0) return;
  if (total == 1) {
    fn(size_t{0});
    return;
  }
  using Fn = std::remove_reference_t<F>;
  struct Job {
    Fn* fn = nullptr;
    std::atomic<bool> failed{false};
    std::exception_ptr error;
  } job;
  job.fn = &fn;
  // Exceptions must not unwind through ORT's thread pool: catch them per call.
  auto trampoline = [](void* data, size_t i) noexcept {
    Job* j = static_cast<Job*>(data);
    if (j->failed.load(std::memory_order_relaxed)) return;
    try {
      (*j->fn)(i);
    } catch (...) {
      bool expected = false;
      if (j->failed.compare_exchange_strong(expected, true)) j->error = std::current_exception();
    }
  };
  api_.check(ort::KernelContext_ParallelFor(api_.raw())(ctx_, trampoline, total, 0, &job),
             "KernelContext_ParallelFor");
  g_parallel_for_calls.fetch_add(1, std::memory_order_relaxed);
  if (job.error) std::rethrow_exception(job.error);
}

// Type and shape of one value during ORT's shape inference. A dim is known
// (dims[i] >= 0), symbolic (dims[i] < 0 and symbols[i] non-empty) or unknown.
struct ShapeInfo {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Shape dims;
  std::vector<std::string> symbols;
};

class ShapeInferContext {
 public:
  ShapeInferContext(const Api& api, OrtShapeInferContext* ctx) : api_(api), ctx_(ctx) {}
  const Api& api() const { return api_; }
  size_t input_count() const;
  ShapeInfo input(size_t index) const;
  // Sets output `index` to `info` (type and dims; symbolic dims keep their names).
  void set_output(size_t index, const ShapeInfo& info) const;

 private:
  const Api& api_;
  OrtShapeInferContext* ctx_;
};

// ---- OrtCustomOp construction ------------------------------------------------------

// The OrtApi registration received (needed by callbacks ORT calls without one).
void set_api(const OrtApi* api);
const OrtApi* get_api();

namespace detail {

template <class K, class = void>
struct has_infer : std::false_type {};
template <class K>
struct has_infer<K, std::void_t<decltype(K::infer_shapes(std::declval<ShapeInferContext&>()))>> : std::true_type {};

// Converts any exception into an OrtStatus prefixed with the op name.
OrtStatus* to_status(const Api& api) noexcept;  // call from inside a catch block

template <class K, class = void>
struct has_required_inputs : std::false_type {};
template <class K>
struct has_required_inputs<K, std::void_t<decltype(K::required_inputs)>> : std::true_type {};

template <class K>
struct Instance {
  Api api;
  K kernel;
  Instance(const OrtApi* a, const OrtKernelInfo* info) : api(a, K::name()), kernel(api, KernelInfo(api, info)) {}
};

template <class K>
struct Callbacks {
  static const char* GetName(const OrtCustomOp*) { return K::name(); }
  static const char* GetExecutionProviderType(const OrtCustomOp*) { return "CPUExecutionProvider"; }
  static size_t GetInputTypeCount(const OrtCustomOp*) { return std::size(K::inputs); }
  static size_t GetOutputTypeCount(const OrtCustomOp*) { return std::size(K::outputs); }
  static ONNXTensorElementDataType GetInputType(const OrtCustomOp*, size_t i) {
    return i < std::size(K::inputs) ? K::inputs[i] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  }
  static ONNXTensorElementDataType GetOutputType(const OrtCustomOp*, size_t i) {
    return i < std::size(K::outputs) ? K::outputs[i] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  }
  static OrtCustomOpInputOutputCharacteristic GetCharacteristic(const OrtCustomOp*, size_t) {
    return INPUT_OUTPUT_REQUIRED;
  }
  static OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(const OrtCustomOp*, size_t i) {
    if constexpr (has_required_inputs<K>::value) {
      return i >= size_t(K::required_inputs) ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
    } else {
      return INPUT_OUTPUT_REQUIRED;
    }
  }
  static OrtMemType GetInputMemoryType(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
  static int GetVariadicMinArity(const OrtCustomOp*) { return 1; }
  static int GetVariadicHomogeneity(const OrtCustomOp*) { return 1; }
  static int GetStartVersion(const OrtCustomOp*) { return 1; }
  static int GetEndVersion(const OrtCustomOp*) { return INT_MAX; }
  static size_t GetNoAliases(int** in, int** out) {
    if (in) *in = nullptr;
    if (out) *out = nullptr;
    return 0;
  }
  static void ReleaseNoAliases(int*, int*) {}

  static OrtStatus* CreateKernelV2(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) {
    *out = nullptr;
    Api a(api, K::name());
    try {
      *out = new Instance<K>(api, info);
      return nullptr;
    } catch (...) {
      return to_status(a);
    }
  }
  static OrtStatus* KernelComputeV2(void* kernel, OrtKernelContext* ctx) {
    auto* inst = static_cast<Instance<K>*>(kernel);
    try {
      Context c(inst->api, ctx);
      inst->kernel.compute(c);
      return nullptr;
    } catch (...) {
      return to_status(inst->api);
    }
  }
  static void KernelDestroy(void* kernel) { delete static_cast<Instance<K>*>(kernel); }

  // V1 callbacks: ORT uses them only if the V2 ones are missing, which make_op never
  // allows; they exist so that no NULL pointer is ever reachable. Errors cannot be
  // reported through V1, so they are printed.
  static void* CreateKernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info) {
    void* out = nullptr;
    if (OrtStatus* s = CreateKernelV2(op, api, info, &out)) {
      std::fprintf(stderr, "%s\n", ort::GetErrorMessage(api)(s));
      ort::ReleaseStatus(api)(s);
    }
    return out;
  }
  static void KernelCompute(void* kernel, OrtKernelContext* ctx) {
    if (kernel == nullptr) return;
    auto* inst = static_cast<Instance<K>*>(kernel);
    if (OrtStatus* s = KernelComputeV2(kernel, ctx)) {
      std::fprintf(stderr, "%s\n", ort::GetErrorMessage(inst->api.raw())(s));
      ort::ReleaseStatus(inst->api.raw())(s);
    }
  }

  static OrtStatus* InferOutputShape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
    Api a(get_api(), K::name());
    if (a.raw() == nullptr) return nullptr;
    try {
      ShapeInferContext c(a, ctx);
      K::infer_shapes(c);
      return nullptr;
    } catch (...) {
      return to_status(a);
    }
  }
};

}  // namespace detail

// An OrtCustomOp for kernel K, every field set (nothing NULL that ORT may call).
template <class K>
OrtCustomOp make_op() {
  using C = detail::Callbacks<K>;
  OrtCustomOp op;
  std::memset(&op, 0, sizeof op);
  op.version = kOrtApiVersion;
  op.CreateKernel = &C::CreateKernel;
  op.GetName = &C::GetName;
  op.GetExecutionProviderType = &C::GetExecutionProviderType;
  op.GetInputType = &C::GetInputType;
  op.GetInputTypeCount = &C::GetInputTypeCount;
  op.GetOutputType = &C::GetOutputType;
  op.GetOutputTypeCount = &C::GetOutputTypeCount;
  op.KernelCompute = &C::KernelCompute;
  op.KernelDestroy = &C::KernelDestroy;
  op.GetInputCharacteristic = &C::GetInputCharacteristic;
  op.GetOutputCharacteristic = &C::GetCharacteristic;
  op.GetInputMemoryType = &C::GetInputMemoryType;
  op.GetVariadicInputMinArity = &C::GetVariadicMinArity;
  op.GetVariadicInputHomogeneity = &C::GetVariadicHomogeneity;
  op.GetVariadicOutputMinArity = &C::GetVariadicMinArity;
  op.GetVariadicOutputHomogeneity = &C::GetVariadicHomogeneity;
  op.CreateKernelV2 = &C::CreateKernelV2;
  op.KernelComputeV2 = &C::KernelComputeV2;
  if constexpr (detail::has_infer<K>::value) op.InferOutputShapeFn = &C::InferOutputShape;
  op.GetStartVersion = &C::GetStartVersion;
  op.GetEndVersion = &C::GetEndVersion;
  op.GetMayInplace = &C::GetNoAliases;
  op.ReleaseMayInplace = &C::ReleaseNoAliases;
  op.GetAliasMap = &C::GetNoAliases;
  op.ReleaseAliasMap = &C::ReleaseNoAliases;
  return op;
}

// The OrtCustomOps of one op (one per element type), defined by GRAPHKIT_OPS.
struct OpSet {
  const char* name;
  const OrtCustomOp* ops;
  size_t count;
};

// The registration table graphkit generates for each library it links (register.cc
// reads it): every domain once, with the op sets registered in it.
using OpSetFn = const OpSet* (*)();
struct DomainEntry {
  const char* domain;
  const OpSetFn* ops;
  size_t count;
};
extern const DomainEntry kRegistration[];
extern const size_t kRegistrationCount;
// "domain::name,domain::name,...": what the library serves.
extern const char* const kServedOps;

}  // namespace gk

// ---- GRAPHKIT_OPS ---------------------------------------------------------------------
// GRAPHKIT_OPS(op_name, op1, op2, ...) defines the OpSet of op `op_name` (op1... are
// OrtCustomOp values, usually gk::make_op<K>()). Use it once per native op, at global
// scope. The symbol is unique per package (GRAPHKIT_PACKAGE_ID is set by graphkit's
// build), so two packages may both have an op called `op_name` in different domains.
#ifndef GRAPHKIT_PACKAGE_ID
#define GRAPHKIT_PACKAGE_ID unnamed_package
#endif
#define GK_CAT2_(a, b) a##b
#define GK_CAT_(a, b) GK_CAT2_(a, b)
#define GRAPHKIT_OPSET_SYMBOL(op_name) GK_CAT_(GK_CAT_(GK_CAT_(graphkit_opset__, GRAPHKIT_PACKAGE_ID), __), op_name)
#define GRAPHKIT_OPS(op_name, ...)                                                          \
  extern "C" const ::gk::OpSet* GRAPHKIT_OPSET_SYMBOL(op_name)(void);                      \
  extern "C" const ::gk::OpSet* GRAPHKIT_OPSET_SYMBOL(op_name)(void) {                     \
    static const OrtCustomOp gk_ops_[] = {__VA_ARGS__};                                    \
    static const ::gk::OpSet gk_set_{#op_name, gk_ops_, sizeof(gk_ops_) / sizeof(gk_ops_[0])}; \
    return &gk_set_;                                                                       \
  }
