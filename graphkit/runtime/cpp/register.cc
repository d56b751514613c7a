// Entry points of libgraphkit_ops.so, the native kernel library ONNX Runtime loads with
// SessionOptions.register_custom_ops_library(path).
//
// The library does not link libonnxruntime: everything goes through the OrtApiBase
// handed to RegisterCustomOps. Only the extern "C" functions below are exported
// (the build uses -fvisibility=hidden).
#include <mutex>
#include <string>
#include <vector>

#include "kernel.h"

#define GK_EXPORT extern "C" __attribute__((visibility("default")))

// ---- the registration table: one line per op ------------------------------------------
// X(name) needs `const gk::OpSet& gk::ops_<name>()` defined in custom_ops/<name>/<name>.cc.
#define GRAPHKIT_NATIVE_OPS(X) \
  X(my_add) \
  X(deform_conv2d)

namespace gk {
#define GK_DECLARE(name) const OpSet& ops_##name();
GRAPHKIT_NATIVE_OPS(GK_DECLARE)
#undef GK_DECLARE

namespace {

using OpSetFn = const OpSet& (*)();
#define GK_ENTRY(name) &ops_##name,
constexpr OpSetFn kTable[] = {GRAPHKIT_NATIVE_OPS(GK_ENTRY)};
#undef GK_ENTRY

// The same kernels serve both domains: "custom" is the placeholder domain exporters
// emit (such models run as they are), "graphkit.native" is what
// `graphkit rewrite --bind native` retargets nodes to.
constexpr const char* kDomains[] = {"custom", "graphkit.native"};

// Domains must outlive every session built from the options they were added to;
// they are kept here and released when the library is unloaded.
struct DomainStore {
  std::mutex mutex;
  std::vector<std::pair<const OrtApi*, OrtCustomOpDomain*>> domains;
  ~DomainStore() {
    for (auto& [api, domain] : domains) ort::ReleaseCustomOpDomain(api)(domain);
  }
};
DomainStore& store() {
  static DomainStore s;
  return s;
}

}  // namespace
}  // namespace gk

GK_EXPORT const char* graphkit_native_ops(void) {
  static const std::string names = [] {
    std::string s;
    for (auto fn : gk::kTable) {
      if (!s.empty()) s += ",";
      s += fn().name;
    }
    return s;
  }();
  return names.c_str();
}

// The OrtApi version this library requests and declares in its OrtCustomOps.
GK_EXPORT uint32_t graphkit_native_api_version(void) { return gk::kOrtApiVersion; }

// How many KernelContext_ParallelFor calls succeeded in this process (diagnostics).
GK_EXPORT uint64_t graphkit_native_parallel_for_calls(void) {
  return gk::g_parallel_for_calls.load(std::memory_order_relaxed);
}

GK_EXPORT OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  if (base == nullptr || base->GetApi == nullptr) return nullptr;  // nothing to report through
  const OrtApi* api = base->GetApi(gk::kOrtApiVersion);
  if (api == nullptr) {
    // Older ORT: report through the oldest API table, which every ORT serves.
    const OrtApi* v1 = base->GetApi(1);
    if (v1 == nullptr) return nullptr;
    std::string msg = "[graphkit] the native kernel library needs ONNX Runtime >= 1.17 (C API version " +
                      std::to_string(gk::kOrtApiVersion) + "); this is ONNX Runtime " +
                      (base->GetVersionString ? base->GetVersionString() : "(unknown)");
    return ort::CreateStatus(v1)(ORT_FAIL, msg.c_str());
  }
  gk::set_api(api);
  gk::Api gapi(api, "graphkit");
  try {
    auto& s = gk::store();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const char* name : gk::kDomains) {
      OrtCustomOpDomain* domain = nullptr;
      gapi.check(ort::CreateCustomOpDomain(api)(name, &domain), "CreateCustomOpDomain");
      s.domains.emplace_back(api, domain);
      for (auto fn : gk::kTable) {
        const gk::OpSet& set = fn();
        for (size_t i = 0; i < set.count; ++i) gapi.check(ort::CustomOpDomain_Add(api)(domain, &set.ops[i]), "CustomOpDomain_Add");
      }
      gapi.check(ort::AddCustomOpDomain(api)(options, domain), "AddCustomOpDomain");
    }
    return nullptr;
  } catch (...) {
    return gk::detail::to_status(gapi);
  }
}
