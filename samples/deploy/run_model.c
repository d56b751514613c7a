/* run_model.c: run an ONNX model whose custom ops a kernel library serves, in plain ONNX
 * Runtime, from C: what a C or C++ server does with a folder `graphkit deploy` wrote.
 *
 *   cc -o run_model run_model.c -ldl
 *   ./run_model LIBONNXRUNTIME KERNELS.so MODEL.onnx OUTPUT NAME=FILE:2x3 [NAME=FILE:DIMS ...]
 *
 * LIBONNXRUNTIME is ONNX Runtime's shared library (the onnxruntime wheel has it in
 * onnxruntime/capi/libonnxruntime.so.*; a C/C++ release has lib/libonnxruntime.so). Each
 * input is a raw float32 file of the given shape; the output OUTPUT (float32) is printed as
 * "shape D0 D1 ..." and then one value per line.
 *
 * No ONNX Runtime header is needed (the wheel ships none): the few types used are declared
 * below. The C API is stable and append-only: OrtApi is a table of function pointers read
 * here by slot, the 0-based position of the field in `struct OrtApi` of
 * include/onnxruntime/core/session/onnxruntime_c_api.h (each checked there). With the
 * official header, call api->RegisterCustomOpsLibrary_V2(...) and so on directly; in C++,
 * Ort::SessionOptions::RegisterCustomOpsLibrary(path). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct OrtApi OrtApi;
typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtSession OrtSession;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtShape;
typedef struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

enum { API_VERSION = 17 };            /* what graphkit's kernel libraries need: ONNX Runtime >= 1.17 */
enum { LOG_WARNING = 2 };             /* OrtLoggingLevel ORT_LOGGING_LEVEL_WARNING */
enum { DEVICE_ALLOCATOR = 0, MEM_DEFAULT = 0 };  /* OrtDeviceAllocator, OrtMemTypeDefault */
enum { FLOAT = 1 };                   /* ONNXTensorElementDataType: TensorProto's numbers */

/* OrtApi slots used here. */
enum {
  GetErrorMessage = 2,
  CreateEnv = 3,
  CreateSession = 7,
  Run = 9,
  CreateSessionOptions = 10,
  CreateTensorWithDataAsOrtValue = 49,
  GetTensorMutableData = 51,
  GetTensorElementType = 60,
  GetDimensionsCount = 61,
  GetDimensions = 62,
  GetTensorShapeElementCount = 64,
  GetTensorTypeAndShape = 65,
  CreateCpuMemoryInfo = 69,
  ReleaseEnv = 92,
  ReleaseMemoryInfo = 94,
  ReleaseSession = 95,
  ReleaseValue = 96,
  ReleaseTensorTypeAndShapeInfo = 99,
  ReleaseSessionOptions = 100,
  RegisterCustomOpsLibrary_V2 = 228,
};

static const OrtApi* api;
#define FN(slot, type) ((type)((void* const*)api)[slot])

static void check(OrtStatus* status, const char* what) {
  if (status == NULL) return;
  const char* message = FN(GetErrorMessage, const char* (*)(const OrtStatus*))(status);
  fprintf(stderr, "run_model: %s failed: %s\n", what, message);
  exit(1);
}

static void* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) { perror(path); exit(2); }
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  void* data = malloc(*size ? *size : 1);
  if (fread(data, 1, *size, f) != *size) { perror(path); exit(2); }
  fclose(f);
  return data;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s LIBONNXRUNTIME KERNELS.so MODEL.onnx OUTPUT NAME=FILE:DIMS...\n", argv[0]);
    return 2;
  }
  void* ort = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (ort == NULL) { fprintf(stderr, "run_model: %s\n", dlerror()); return 1; }
  const OrtApiBase* (*get_base)(void) = (const OrtApiBase* (*)(void))dlsym(ort, "OrtGetApiBase");
  if (get_base == NULL || (api = get_base()->GetApi(API_VERSION)) == NULL) {
    fprintf(stderr, "run_model: %s does not serve the ONNX Runtime C API %d\n", argv[1], API_VERSION);
    return 1;
  }

  OrtEnv* env;
  check(FN(CreateEnv, OrtStatus* (*)(int, const char*, OrtEnv**))(LOG_WARNING, "run_model", &env), "CreateEnv");
  OrtSessionOptions* options;
  check(FN(CreateSessionOptions, OrtStatus* (*)(OrtSessionOptions**))(&options), "CreateSessionOptions");
  /* The one line that makes the model's custom ops known to ONNX Runtime. */
  check(FN(RegisterCustomOpsLibrary_V2, OrtStatus* (*)(OrtSessionOptions*, const char*))(options, argv[2]),
        "RegisterCustomOpsLibrary_V2");
  OrtSession* session;
  check(FN(CreateSession, OrtStatus* (*)(const OrtEnv*, const char*, const OrtSessionOptions*, OrtSession**))(
            env, argv[3], options, &session), "CreateSession");

  OrtMemoryInfo* cpu;
  check(FN(CreateCpuMemoryInfo, OrtStatus* (*)(int, int, OrtMemoryInfo**))(DEVICE_ALLOCATOR, MEM_DEFAULT, &cpu),
        "CreateCpuMemoryInfo");
  int n = argc - 5;
  const char** names = calloc((size_t)n, sizeof *names);
  OrtValue** inputs = calloc((size_t)n, sizeof *inputs);
  void** buffers = calloc((size_t)n, sizeof *buffers);  /* the tensors use them: freed last */
  for (int i = 0; i < n; ++i) {  /* NAME=FILE:D0xD1x... */
    char* spec = argv[5 + i];
    char* eq = strchr(spec, '=');
    char* colon = eq ? strrchr(eq, ':') : NULL;
    if (colon == NULL) { fprintf(stderr, "run_model: input %s is not NAME=FILE:DIMS\n", spec); return 2; }
    *eq = *colon = '\0';
    names[i] = spec;
    int64_t dims[16];
    size_t rank = 0, count = 1;
    for (char* d = strtok(colon + 1, "x"); d != NULL && rank < 16; d = strtok(NULL, "x")) {
      dims[rank] = strtoll(d, NULL, 10);
      count *= (size_t)dims[rank++];
    }
    size_t size;
    void* data = buffers[i] = read_file(eq + 1, &size);
    if (size != count * sizeof(float)) {
      fprintf(stderr, "run_model: %s holds %zu bytes, its shape needs %zu\n", eq + 1, size, count * sizeof(float));
      return 2;
    }
    check(FN(CreateTensorWithDataAsOrtValue,
             OrtStatus* (*)(const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, int, OrtValue**))(
              cpu, data, size, dims, rank, FLOAT, &inputs[i]), "CreateTensorWithDataAsOrtValue");
  }

  const char* output_name = argv[4];
  OrtValue* output = NULL;
  check(FN(Run, OrtStatus* (*)(OrtSession*, const void*, const char* const*, const OrtValue* const*, size_t,
                               const char* const*, size_t, OrtValue**))(
            session, NULL, names, (const OrtValue* const*)inputs, (size_t)n, &output_name, 1, &output), "Run");

  OrtShape* shape;
  check(FN(GetTensorTypeAndShape, OrtStatus* (*)(const OrtValue*, OrtShape**))(output, &shape),
        "GetTensorTypeAndShape");
  int type;
  size_t rank, count;
  int64_t dims[16];
  check(FN(GetTensorElementType, OrtStatus* (*)(const OrtShape*, int*))(shape, &type), "GetTensorElementType");
  check(FN(GetDimensionsCount, OrtStatus* (*)(const OrtShape*, size_t*))(shape, &rank), "GetDimensionsCount");
  if (type != FLOAT || rank > 16) { fprintf(stderr, "run_model: %s is not a float32 tensor\n", output_name); return 1; }
  check(FN(GetDimensions, OrtStatus* (*)(const OrtShape*, int64_t*, size_t))(shape, dims, rank), "GetDimensions");
  check(FN(GetTensorShapeElementCount, OrtStatus* (*)(const OrtShape*, size_t*))(shape, &count),
        "GetTensorShapeElementCount");
  float* values;
  check(FN(GetTensorMutableData, OrtStatus* (*)(OrtValue*, void**))(output, (void**)&values), "GetTensorMutableData");
  printf("shape");
  for (size_t i = 0; i < rank; ++i) printf(" %lld", (long long)dims[i]);
  printf("\n");
  for (size_t i = 0; i < count; ++i) printf("%.9g\n", values[i]);

  FN(ReleaseTensorTypeAndShapeInfo, void (*)(OrtShape*))(shape);
  FN(ReleaseValue, void (*)(OrtValue*))(output);
  for (int i = 0; i < n; ++i) {
    FN(ReleaseValue, void (*)(OrtValue*))(inputs[i]);
    free(buffers[i]);
  }
  FN(ReleaseMemoryInfo, void (*)(OrtMemoryInfo*))(cpu);
  FN(ReleaseSession, void (*)(OrtSession*))(session);
  FN(ReleaseSessionOptions, void (*)(OrtSessionOptions*))(options);
  FN(ReleaseEnv, void (*)(OrtEnv*))(env);
  return 0;
}
