// Entry points of every native kernel library graphkit links; ONNX Runtime loads it with
// SessionOptions.register_custom_ops_library(path).
//
// What the library registers comes from the table graphkit generates when it links the
// library (gk::kRegistration: each domain once, with the GRAPHKIT_OPS sets it serves), so
// the ops of several packages, sharing a domain or not, are served by one library.
//
// The library does not link libonnxruntime: everything goes through the OrtApiBase
// handed to RegisterCustomOps. Only the extern "C" functions below are exported
// (the build uses -fvisibility=hidden).
#include <mutex>
#include <string>
#include <vector>

#include "graphkit/kernel.h"

#define GK_EXPORT extern "C" __attribute__((visibility("default")))

namespace gk {
namespace {

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

// "domain::name,..." for every op the library registers, in every domain.
GK_EXPORT const char* graphkit_native_ops(void) { return gk::kServedOps; }

// "domain::name=IN,IN>OUT|IN,IN>OUT;..." for every op in every domain: per kernel (one per
// element type), its input and output element types as ONNX TensorProto numbers. Read by
// `graphkit deploy` for the manifest; the callbacks it calls need no OrtApi.
GK_EXPORT const char* graphkit_native_op_types(void) {
  static const std::string text = [] {
    std::string out;
    for (size_t d = 0; d < gk::kRegistrationCount; ++d) {
      const gk::DomainEntry& entry = gk::kRegistration[d];
      for (size_t k = 0; k < entry.count; ++k) {
        const gk::OpSet* set = entry.ops[k]();
        if (!out.empty()) out += ';';
        out += std::string(entry.domain) + "::" + set->name + "=";
        for (size_t i = 0; i < set->count; ++i) {
          const OrtCustomOp* op = &set->ops[i];
          if (i) out += '|';
          for (size_t j = 0, n = op->GetInputTypeCount(op); j < n; ++j) {
            out += (j ? "," : "") + std::to_string(op->GetInputType(op, j));
          }
          out += '>';
          for (size_t j = 0, n = op->GetOutputTypeCount(op); j < n; ++j) {
            out += (j ? "," : "") + std::to_string(op->GetOutputType(op, j));
          }
        }
      }
    }
    return out;
  }();
  return text.c_str();
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
    for (size_t d = 0; d < gk::kRegistrationCount; ++d) {
      const gk::DomainEntry& entry = gk::kRegistration[d];
      OrtCustomOpDomain* domain = nullptr;
      gapi.check(ort::CreateCustomOpDomain(api)(entry.domain, &domain), "CreateCustomOpDomain");
      s.domains.emplace_back(api, domain);
      for (size_t k = 0; k < entry.count; ++k) {
        const gk::OpSet* set = entry.ops[k]();
        for (size_t i = 0; i < set->count; ++i) {
          gapi.check(ort::CustomOpDomain_Add(api)(domain, &set->ops[i]), "CustomOpDomain_Add");
        }
      }
      gapi.check(ort::AddCustomOpDomain(api)(options, domain), (std::string("AddCustomOpDomain '") + entry.domain + "'").c_str());
    }
    return nullptr;
  } catch (...) {
    return gk::detail::to_status(gapi);
  }
}
