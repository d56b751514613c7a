// Out-of-line parts of the kernel helpers (see kernel.h).
#include "graphkit/kernel.h"

#include <new>

namespace gk {

std::atomic<uint64_t> g_parallel_for_calls{0};

namespace {
std::atomic<const OrtApi*> g_api{nullptr};

// Owns an OrtTensorTypeAndShapeInfo.
struct InfoHandle {
  const OrtApi* api;
  OrtTensorTypeAndShapeInfo* p = nullptr;
  explicit InfoHandle(const OrtApi* a) : api(a) {}
  ~InfoHandle() {
    if (p) ort::ReleaseTensorTypeAndShapeInfo(api)(p);
  }
  InfoHandle(const InfoHandle&) = delete;
  InfoHandle& operator=(const InfoHandle&) = delete;
};
}  // namespace

void set_api(const OrtApi* api) { g_api.store(api, std::memory_order_release); }
const OrtApi* get_api() { return g_api.load(std::memory_order_acquire); }

std::string shape_str(const int64_t* dims, size_t rank) {
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) {
    if (i) s += ",";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

namespace detail {
OrtStatus* to_status(const Api& api) noexcept {
  try {
    throw;
  } catch (const Error& e) {
    // Messages made by Api::fail already carry the "[op] " prefix.
    return ort::CreateStatus(api.raw())(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return ort::CreateStatus(api.raw())(ORT_RUNTIME_EXCEPTION, api.prefixed("out of memory").c_str());
  } catch (const std::exception& e) {
    return ort::CreateStatus(api.raw())(ORT_RUNTIME_EXCEPTION, api.prefixed(std::string("internal error: ") + e.what()).c_str());
  } catch (...) {
    return ort::CreateStatus(api.raw())(ORT_RUNTIME_EXCEPTION, api.prefixed("internal error (unknown exception)").c_str());
  }
}
}  // namespace detail

// ---- KernelInfo -----------------------------------------------------------------------

namespace {
// Type, shape and data of a tensor value.
TensorView view_of(const Api& api, const OrtValue* value) {
  const OrtApi* a = api.raw();
  TensorView t;
  {
    InfoHandle info(a);
    api.check(ort::GetTensorTypeAndShape(a)(value, &info.p), "GetTensorTypeAndShape");
    api.check(ort::GetTensorElementType(a)(info.p, &t.type), "GetTensorElementType");
    size_t rank = 0;
    api.check(ort::GetDimensionsCount(a)(info.p, &rank), "GetDimensionsCount");
    t.shape.resize(rank);
    if (rank) api.check(ort::GetDimensions(a)(info.p, t.shape.data(), rank), "GetDimensions");
    api.check(ort::GetTensorShapeElementCount(a)(info.p, &t.size), "GetTensorShapeElementCount");
  }
  void* data = nullptr;
  // ORT has no const accessor in the early API; the data is only read.
  api.check(ort::GetTensorMutableData(a)(const_cast<OrtValue*>(value), &data), "GetTensorMutableData");
  t.data = data;
  return t;
}
}  // namespace

bool KernelInfo::constant_input(size_t index, TensorView& out) const {
  int is_constant = 0;
  const OrtValue* value = nullptr;
  if (!try_get([&] { return ort::KernelInfoGetConstantInput_tensor(api_.raw())(info_, index, &is_constant, &value); }))
    return false;  // no such input
  if (!is_constant || value == nullptr) return false;
  out = view_of(api_, value);
  return true;
}

bool KernelInfo::has(const char* name) const {
  const OrtApi* a = api_.raw();
  int64_t i;
  float f;
  size_t n = 0;
  return try_get([&] { return ort::KernelInfoGetAttribute_int64(a)(info_, name, &i); }) ||
         try_get([&] { return ort::KernelInfoGetAttribute_float(a)(info_, name, &f); }) ||
         try_get([&] { return ort::KernelInfoGetAttribute_string(a)(info_, name, nullptr, &n); }) ||
         try_get([&] { return ort::KernelInfoGetAttributeArray_int64(a)(info_, name, nullptr, &n); }) ||
         try_get([&] { return ort::KernelInfoGetAttributeArray_float(a)(info_, name, nullptr, &n); });
}

int64_t KernelInfo::get_int(const char* name) const {
  int64_t v = 0;
  api_.check(ort::KernelInfoGetAttribute_int64(api_.raw())(info_, name, &v), (std::string("attribute '") + name + "'").c_str());
  return v;
}

int64_t KernelInfo::get_int(const char* name, int64_t fallback) const {
  int64_t v = 0;
  return try_get([&] { return ort::KernelInfoGetAttribute_int64(api_.raw())(info_, name, &v); }) ? v : fallback;
}

float KernelInfo::get_float(const char* name) const {
  float v = 0;
  api_.check(ort::KernelInfoGetAttribute_float(api_.raw())(info_, name, &v), (std::string("attribute '") + name + "'").c_str());
  return v;
}

float KernelInfo::get_float(const char* name, float fallback) const {
  float v = 0;
  return try_get([&] { return ort::KernelInfoGetAttribute_float(api_.raw())(info_, name, &v); }) ? v : fallback;
}

std::string KernelInfo::get_string(const char* name) const {
  const std::string what = std::string("attribute '") + name + "'";
  size_t n = 0;
  api_.check(ort::KernelInfoGetAttribute_string(api_.raw())(info_, name, nullptr, &n), what.c_str());
  std::string v(n, '\0');  // n counts the terminating NUL
  api_.check(ort::KernelInfoGetAttribute_string(api_.raw())(info_, name, v.data(), &n), what.c_str());
  v.resize(n ? n - 1 : 0);
  return v;
}

std::string KernelInfo::get_string(const char* name, const std::string& fallback) const {
  size_t n = 0;
  if (!try_get([&] { return ort::KernelInfoGetAttribute_string(api_.raw())(info_, name, nullptr, &n); })) return fallback;
  return get_string(name);
}

std::vector<int64_t> KernelInfo::get_ints(const char* name) const {
  const std::string what = std::string("attribute '") + name + "'";
  size_t n = 0;
  api_.check(ort::KernelInfoGetAttributeArray_int64(api_.raw())(info_, name, nullptr, &n), what.c_str());
  std::vector<int64_t> v(n);
  if (n) api_.check(ort::KernelInfoGetAttributeArray_int64(api_.raw())(info_, name, v.data(), &n), what.c_str());
  return v;
}

std::vector<float> KernelInfo::get_floats(const char* name) const {
  const std::string what = std::string("attribute '") + name + "'";
  size_t n = 0;
  api_.check(ort::KernelInfoGetAttributeArray_float(api_.raw())(info_, name, nullptr, &n), what.c_str());
  std::vector<float> v(n);
  if (n) api_.check(ort::KernelInfoGetAttributeArray_float(api_.raw())(info_, name, v.data(), &n), what.c_str());
  return v;
}

// ---- Context --------------------------------------------------------------------------

size_t Context::input_count() const {
  size_t n = 0;
  api_.check(ort::KernelContext_GetInputCount(api_.raw())(ctx_, &n), "KernelContext_GetInputCount");
  return n;
}

size_t Context::output_count() const {
  size_t n = 0;
  api_.check(ort::KernelContext_GetOutputCount(api_.raw())(ctx_, &n), "KernelContext_GetOutputCount");
  return n;
}

TensorView Context::input(size_t index) const {
  const OrtValue* value = nullptr;
  api_.check(ort::KernelContext_GetInput(api_.raw())(ctx_, index, &value), "KernelContext_GetInput");
  if (value == nullptr) api_.fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(index) + " is missing");
  return view_of(api_, value);
}

bool Context::optional_input(size_t index, TensorView& out) const {
  if (index >= input_count()) return false;
  const OrtValue* value = nullptr;
  api_.check(ort::KernelContext_GetInput(api_.raw())(ctx_, index, &value), "KernelContext_GetInput");
  if (value == nullptr) return false;
  out = input(index);
  return true;
}

void* Context::output(size_t index, const Shape& shape) const {
  const OrtApi* a = api_.raw();
  OrtValue* value = nullptr;
  api_.check(ort::KernelContext_GetOutput(a)(ctx_, index, shape.data(), shape.size(), &value), "KernelContext_GetOutput");
  if (value == nullptr) api_.fail(ORT_FAIL, "could not allocate output " + std::to_string(index));
  void* data = nullptr;
  api_.check(ort::GetTensorMutableData(a)(value, &data), "GetTensorMutableData");
  return data;
}

// ---- ShapeInferContext ------------------------------------------------------------------

size_t ShapeInferContext::input_count() const {
  size_t n = 0;
  api_.check(ort::ShapeInferContext_GetInputCount(api_.raw())(ctx_, &n), "ShapeInferContext_GetInputCount");
  return n;
}

ShapeInfo ShapeInferContext::input(size_t index) const {
  const OrtApi* a = api_.raw();
  OrtTensorTypeAndShapeInfo* info = nullptr;  // owned by the context: not released
  api_.check(ort::ShapeInferContext_GetInputTypeShape(a)(ctx_, index, &info), "ShapeInferContext_GetInputTypeShape");
  ShapeInfo s;
  api_.check(ort::GetTensorElementType(a)(info, &s.type), "GetTensorElementType");
  size_t rank = 0;
  api_.check(ort::GetDimensionsCount(a)(info, &rank), "GetDimensionsCount");
  s.dims.resize(rank);
  s.symbols.resize(rank);
  if (rank) {
    api_.check(ort::GetDimensions(a)(info, s.dims.data(), rank), "GetDimensions");
    std::vector<const char*> names(rank, nullptr);
    api_.check(ort::GetSymbolicDimensions(a)(info, names.data(), rank), "GetSymbolicDimensions");
    for (size_t i = 0; i < rank; ++i) {
      if (s.dims[i] < 0 && names[i] != nullptr) s.symbols[i] = names[i];
    }
  }
  return s;
}

void ShapeInferContext::set_output(size_t index, const ShapeInfo& s) const {
  const OrtApi* a = api_.raw();
  InfoHandle info(a);
  api_.check(ort::CreateTensorTypeAndShapeInfo(a)(&info.p), "CreateTensorTypeAndShapeInfo");
  api_.check(ort::SetTensorElementType(a)(info.p, s.type), "SetTensorElementType");
  api_.check(ort::SetDimensions(a)(info.p, s.dims.data(), s.dims.size()), "SetDimensions");
  std::vector<const char*> names(s.dims.size());
  for (size_t i = 0; i < s.dims.size(); ++i) {
    names[i] = (i < s.symbols.size() && s.dims[i] < 0) ? s.symbols[i].c_str() : "";
  }
  if (!names.empty()) api_.check(ort::SetSymbolicDimensions(a)(info.p, names.data(), names.size()), "SetSymbolicDimensions");
  api_.check(ort::ShapeInferContext_SetOutputTypeShape(a)(ctx_, index, info.p), "ShapeInferContext_SetOutputTypeShape");
}

}  // namespace gk
