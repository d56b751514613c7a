// Minimal declarations of the ONNX Runtime C ABI used by graphkit's native kernels.
//
// Written for graphkit (the official headers are not available here). Only what the
// kernels use is declared. The ABI is stable and append-only:
//   * handles are opaque;
//   * `OrtApi` is a table of function pointers that only ever grows, so it is read
//     here as an array indexed by slot (0-based position in the upstream struct);
//   * `OrtCustomOp` is laid out field by field; ORT reads only the fields that
//     existed at the `version` the op declares.
// Slot indices and signatures were checked against upstream
// include/onnxruntime/core/session/onnxruntime_c_api.h (API 1.17+); the
// static_asserts below pin the OrtCustomOp layout on LP64 (x86-64, aarch64).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// ---- opaque handles -------------------------------------------------------------
struct OrtApi;  // never defined: read through the slot accessors below
struct OrtStatus;
struct OrtValue;
struct OrtTensorTypeAndShapeInfo;
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtShapeInferContext;

// ---- enums (C enums are int-sized; fixed here to int32_t) ------------------------
enum OrtErrorCode : int32_t {
  ORT_OK = 0,
  ORT_FAIL = 1,
  ORT_INVALID_ARGUMENT = 2,
  ORT_NO_SUCHFILE = 3,
  ORT_NO_MODEL = 4,
  ORT_ENGINE_ERROR = 5,
  ORT_RUNTIME_EXCEPTION = 6,
  ORT_INVALID_PROTOBUF = 7,
  ORT_MODEL_LOADED = 8,
  ORT_NOT_IMPLEMENTED = 9,
  ORT_INVALID_GRAPH = 10,
  ORT_EP_FAIL = 11,
};

// Same numbering as onnx TensorProto.DataType.
enum ONNXTensorElementDataType : int32_t {
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 = 2,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 = 3,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 = 4,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16 = 5,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 = 7,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING = 8,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE = 11,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32 = 12,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64 = 13,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64 = 14,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128 = 15,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 = 16,
};

enum OrtMemType : int32_t {
  OrtMemTypeCPUInput = -2,
  OrtMemTypeCPUOutput = -1,
  OrtMemTypeDefault = 0,
};

enum OrtCustomOpInputOutputCharacteristic : int32_t {
  INPUT_OUTPUT_REQUIRED = 0,
  INPUT_OUTPUT_OPTIONAL = 1,
  INPUT_OUTPUT_VARIADIC = 2,
};

// ---- entry point handed to RegisterCustomOps -------------------------------------
struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version) noexcept;  // nullptr if unsupported
  const char* (*GetVersionString)() noexcept;
};

// ---- a custom op, as ORT reads it --------------------------------------------------
struct OrtCustomOp {
  uint32_t version;  // highest API version whose fields below are valid
  void* (*CreateKernel)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info);
  const char* (*GetName)(const OrtCustomOp* op);
  const char* (*GetExecutionProviderType)(const OrtCustomOp* op);
  ONNXTensorElementDataType (*GetInputType)(const OrtCustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const OrtCustomOp* op);
  ONNXTensorElementDataType (*GetOutputType)(const OrtCustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const OrtCustomOp* op);
  void (*KernelCompute)(void* op_kernel, OrtKernelContext* context);
  void (*KernelDestroy)(void* op_kernel);
  // version >= 8
  OrtCustomOpInputOutputCharacteristic (*GetInputCharacteristic)(const OrtCustomOp* op, size_t index);
  OrtCustomOpInputOutputCharacteristic (*GetOutputCharacteristic)(const OrtCustomOp* op, size_t index);
  // version >= 13
  OrtMemType (*GetInputMemoryType)(const OrtCustomOp* op, size_t index);
  // version >= 14
  int (*GetVariadicInputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp* op);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp* op);
  // version >= 16
  OrtStatus* (*CreateKernelV2)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                               void** kernel);
  OrtStatus* (*KernelComputeV2)(void* op_kernel, OrtKernelContext* context);
  // version >= 17
  OrtStatus* (*InferOutputShapeFn)(const OrtCustomOp* op, OrtShapeInferContext* ctx);
  int (*GetStartVersion)(const OrtCustomOp* op);
  int (*GetEndVersion)(const OrtCustomOp* op);
  // version >= 18
  size_t (*GetMayInplace)(int** input_index, int** output_index);
  void (*ReleaseMayInplace)(int* input_index, int* output_index);
  size_t (*GetAliasMap)(int** input_index, int** output_index);
  void (*ReleaseAliasMap)(int* input_index, int* output_index);
};

}  // extern "C"

static_assert(sizeof(void*) == 8, "graphkit's ORT declarations assume a 64-bit (LP64) target");
static_assert(sizeof(OrtErrorCode) == 4 && sizeof(ONNXTensorElementDataType) == 4, "C enums are int-sized");
static_assert(offsetof(OrtCustomOp, CreateKernel) == 8, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, KernelCompute) == 64, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, GetInputCharacteristic) == 80, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, GetInputMemoryType) == 96, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, CreateKernelV2) == 136, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, KernelComputeV2) == 144, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, InferOutputShapeFn) == 152, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, GetStartVersion) == 160, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, GetMayInplace) == 176, "OrtCustomOp layout");
static_assert(offsetof(OrtCustomOp, ReleaseAliasMap) == 200, "OrtCustomOp layout");
static_assert(sizeof(OrtCustomOp) == 208, "OrtCustomOp layout");

// ---- the OrtApi table, by slot ------------------------------------------------------
// Each GK_ORT_SLOT(name, index, return type, parameters...) defines
//   ort::slot::name       the slot index,
//   ort::name##_fn        the exact function-pointer type,
//   ort::name(api)        the typed entry read from the table.
namespace ort {

inline void* const* table(const OrtApi* api) { return reinterpret_cast<void* const*>(api); }

#define GK_ORT_SLOT(name, index, ret, ...)                                   \
  namespace slot {                                                           \
  constexpr size_t name = index;                                             \
  }                                                                          \
  using name##_fn = ret (*)(__VA_ARGS__) noexcept;                           \
  inline name##_fn name(const OrtApi* api) {                                 \
    return reinterpret_cast<name##_fn>(table(api)[index]);                   \
  }

// Status
GK_ORT_SLOT(CreateStatus, 0, OrtStatus*, OrtErrorCode code, const char* msg)
GK_ORT_SLOT(GetErrorCode, 1, OrtErrorCode, const OrtStatus* status)
GK_ORT_SLOT(GetErrorMessage, 2, const char*, const OrtStatus* status)
GK_ORT_SLOT(ReleaseStatus, 93, void, OrtStatus* status)
// Registration
GK_ORT_SLOT(CreateCustomOpDomain, 26, OrtStatus*, const char* domain, OrtCustomOpDomain** out)
GK_ORT_SLOT(CustomOpDomain_Add, 27, OrtStatus*, OrtCustomOpDomain* domain, const OrtCustomOp* op)
GK_ORT_SLOT(AddCustomOpDomain, 28, OrtStatus*, OrtSessionOptions* options, OrtCustomOpDomain* domain)
GK_ORT_SLOT(ReleaseCustomOpDomain, 101, void, OrtCustomOpDomain* domain)
// Tensors
GK_ORT_SLOT(GetTensorMutableData, 51, OrtStatus*, OrtValue* value, void** out)
GK_ORT_SLOT(CreateTensorTypeAndShapeInfo, 57, OrtStatus*, OrtTensorTypeAndShapeInfo** out)
GK_ORT_SLOT(SetTensorElementType, 58, OrtStatus*, OrtTensorTypeAndShapeInfo* info, ONNXTensorElementDataType type)
GK_ORT_SLOT(SetDimensions, 59, OrtStatus*, OrtTensorTypeAndShapeInfo* info, const int64_t* dims, size_t count)
GK_ORT_SLOT(GetTensorElementType, 60, OrtStatus*, const OrtTensorTypeAndShapeInfo* info, ONNXTensorElementDataType* out)
GK_ORT_SLOT(GetDimensionsCount, 61, OrtStatus*, const OrtTensorTypeAndShapeInfo* info, size_t* out)
GK_ORT_SLOT(GetDimensions, 62, OrtStatus*, const OrtTensorTypeAndShapeInfo* info, int64_t* dims, size_t count)
GK_ORT_SLOT(GetSymbolicDimensions, 63, OrtStatus*, const OrtTensorTypeAndShapeInfo* info, const char** dim_params,
            size_t count)
GK_ORT_SLOT(GetTensorShapeElementCount, 64, OrtStatus*, const OrtTensorTypeAndShapeInfo* info, size_t* out)
GK_ORT_SLOT(GetTensorTypeAndShape, 65, OrtStatus*, const OrtValue* value, OrtTensorTypeAndShapeInfo** out)
GK_ORT_SLOT(ReleaseTensorTypeAndShapeInfo, 99, void, OrtTensorTypeAndShapeInfo* info)
// Kernel info (attributes)
GK_ORT_SLOT(KernelInfoGetAttribute_float, 85, OrtStatus*, const OrtKernelInfo* info, const char* name, float* out)
GK_ORT_SLOT(KernelInfoGetAttribute_int64, 86, OrtStatus*, const OrtKernelInfo* info, const char* name, int64_t* out)
GK_ORT_SLOT(KernelInfoGetAttribute_string, 87, OrtStatus*, const OrtKernelInfo* info, const char* name, char* out,
            size_t* size)
GK_ORT_SLOT(KernelInfoGetAttributeArray_float, 162, OrtStatus*, const OrtKernelInfo* info, const char* name,
            float* out, size_t* size)
GK_ORT_SLOT(KernelInfoGetAttributeArray_int64, 163, OrtStatus*, const OrtKernelInfo* info, const char* name,
            int64_t* out, size_t* size)
GK_ORT_SLOT(KernelInfoGetConstantInput_tensor, 249, OrtStatus*, const OrtKernelInfo* info, size_t index,
            int* is_constant, const OrtValue** out)
// Kernel context
GK_ORT_SLOT(KernelContext_GetInputCount, 88, OrtStatus*, const OrtKernelContext* ctx, size_t* out)
GK_ORT_SLOT(KernelContext_GetOutputCount, 89, OrtStatus*, const OrtKernelContext* ctx, size_t* out)
GK_ORT_SLOT(KernelContext_GetInput, 90, OrtStatus*, const OrtKernelContext* ctx, size_t index, const OrtValue** out)
GK_ORT_SLOT(KernelContext_GetOutput, 91, OrtStatus*, OrtKernelContext* ctx, size_t index, const int64_t* dims,
            size_t count, OrtValue** out)
GK_ORT_SLOT(KernelContext_ParallelFor, 274, OrtStatus*, const OrtKernelContext* ctx, void (*fn)(void*, size_t),
            size_t total, size_t num_batch, void* user_data)
// Shape inference (the info returned by GetInputTypeShape is owned by the context)
GK_ORT_SLOT(ShapeInferContext_GetInputCount, 267, OrtStatus*, const OrtShapeInferContext* ctx, size_t* out)
GK_ORT_SLOT(ShapeInferContext_GetInputTypeShape, 268, OrtStatus*, const OrtShapeInferContext* ctx, size_t index,
            OrtTensorTypeAndShapeInfo** out)
GK_ORT_SLOT(ShapeInferContext_SetOutputTypeShape, 270, OrtStatus*, const OrtShapeInferContext* ctx, size_t index,
            const OrtTensorTypeAndShapeInfo* info)
GK_ORT_SLOT(SetSymbolicDimensions, 271, OrtStatus*, OrtTensorTypeAndShapeInfo* info, const char** dim_params,
            size_t count)

#undef GK_ORT_SLOT

}  // namespace ort
