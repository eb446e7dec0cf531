// A recording stand-in for libcuda.so.1 (bench/host_path.py): every driver function the direct launch calls, by
// cuda.h's prototype, counting its calls and doing nothing on a GPU, so the switch's host path runs on a CPU.
// Built with cuda.h where it is found (-DCONVBW_HAVE_CUDA_H): the compiler then refuses a prototype here that
// differs from the driver's; host_path.check_signatures compares these prototypes with cuda_launch's ctypes
// declarations. One definition a line, `CUresult NAME(ARGS) {`: host_path.py parses them.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef CONVBW_HAVE_CUDA_H
#include <cuda.h>
#else  // cuda.h's types, as it declares them (CUDA 12/13)
typedef int CUresult;
typedef int CUdevice;
typedef int CUdevice_attribute, CUfunction_attribute, CUstreamCaptureStatus, CUstreamCaptureMode, CUtensorMapDataType;
typedef int CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill;
typedef unsigned long long CUdeviceptr;
typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUevent_st* CUevent;
typedef struct CUtensorMap_st {
  _Alignas(64) cuuint64_t opaque[16];
} CUtensorMap;
#endif

enum {
  kInit, kDeviceGet, kDeviceGetAttribute, kPrimaryCtxRetain, kCtxGetCurrent, kCtxSetCurrent, kModuleLoadData,
  kModuleGetFunction, kFuncSetAttribute, kLaunchKernel, kMemsetD8Async, kMemsetD16Async, kMemsetD32Async,
  kMemcpyAsync, kGetErrorString, kMemAlloc, kMemAllocHost, kMemcpyHtoDAsync, kTensorMapEncodeTiled,
  kTensorMapEncodeIm2col, kGraphLaunch, kStreamIsCapturing, kEventCreate, kEventRecord, kEventQuery,
  kEventSynchronize, kThreadExchangeStreamCaptureMode, kFunctions
};
static const char* const kNames[kFunctions] = {
  "cuInit", "cuDeviceGet", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxSetCurrent",
  "cuModuleLoadData", "cuModuleGetFunction", "cuFuncSetAttribute", "cuLaunchKernel", "cuMemsetD8Async",
  "cuMemsetD16Async", "cuMemsetD32Async", "cuMemcpyAsync", "cuGetErrorString", "cuMemAlloc_v2", "cuMemAllocHost_v2",
  "cuMemcpyHtoDAsync_v2", "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col", "cuGraphLaunch", "cuStreamIsCapturing",
  "cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventSynchronize",
  "cuThreadExchangeStreamCaptureMode"};
static long long g_calls[kFunctions];
static CUdeviceptr g_next_device = 0x700000000000ULL;
static char g_context;
#define COUNT(k) __atomic_fetch_add(&g_calls[k], 1, __ATOMIC_RELAXED)

const char* stub_name(int i) { return i >= 0 && i < kFunctions ? kNames[i] : 0; }
int stub_functions(void) { return kFunctions; }
long long stub_calls(int i) { return i >= 0 && i < kFunctions ? g_calls[i] : -1; }
void stub_reset(void) { memset(g_calls, 0, sizeof g_calls); }
// The GPU's progress, told by the caller: with stub_hold_events(1) an event recorded stays "not ready"
// (cuEventQuery: CUDA_ERROR_NOT_READY) until stub_release_events() or a cuEventSynchronize on it; with 0 (the
// default) the GPU is done at once. stub_set_capturing(s): what cuStreamIsCapturing reports (1: active).
static int g_hold, g_capturing;
static long long g_generation = 1;  // stub_release_events() completes everything recorded before it
struct CUevent_st {
  long long pending;  // the generation it was recorded in while held, 0: complete
};
void stub_hold_events(int hold) { g_hold = hold; }
void stub_release_events(void) { __atomic_fetch_add(&g_generation, 1, __ATOMIC_RELAXED); }
void stub_set_capturing(int status) { g_capturing = status; }
static int event_pending(CUevent e) { return e->pending && e->pending == __atomic_load_n(&g_generation, __ATOMIC_RELAXED); }

CUresult cuInit(unsigned int Flags) { COUNT(kInit); return 0; }
CUresult cuDeviceGet(CUdevice* device, int ordinal) { COUNT(kDeviceGet); *device = ordinal; return 0; }
CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  COUNT(kDeviceGetAttribute);
  *pi = attrib == 75 ? 9 : 0;  // compute capability 9.0: the sm_90a kernels load
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) { COUNT(kPrimaryCtxRetain); *pctx = (CUcontext)&g_context; return 0; }
CUresult cuCtxGetCurrent(CUcontext* pctx) { COUNT(kCtxGetCurrent); *pctx = (CUcontext)&g_context; return 0; }
CUresult cuCtxSetCurrent(CUcontext ctx) { COUNT(kCtxSetCurrent); return 0; }
CUresult cuModuleLoadData(CUmodule* module, const void* image) { COUNT(kModuleLoadData); *module = (CUmodule)&g_context; return 0; }
CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  COUNT(kModuleGetFunction);
  *hfunc = (CUfunction)(uintptr_t)(0x1000 + strlen(name));
  return 0;
}
CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) { COUNT(kFuncSetAttribute); return 0; }
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  COUNT(kLaunchKernel);
  volatile uint64_t first = kernelParams ? *(const uint64_t*)kernelParams[0] : 0;  // read as the driver does
  (void)first;
  return 0;
}
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) { COUNT(kMemsetD8Async); return 0; }
CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) { COUNT(kMemsetD16Async); return 0; }
CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) { COUNT(kMemsetD32Async); return 0; }
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) { COUNT(kMemcpyAsync); return 0; }
CUresult cuGetErrorString(CUresult error, const char** pStr) { COUNT(kGetErrorString); *pStr = "stub error"; return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  COUNT(kMemAlloc);
  *dptr = __atomic_fetch_add(&g_next_device, (bytesize + 255) & ~(size_t)255, __ATOMIC_RELAXED);
  return 0;
}
CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) { COUNT(kMemAllocHost); *pp = aligned_alloc(64, (bytesize + 63) & ~(size_t)63); return *pp ? 0 : 2; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  COUNT(kMemcpyHtoDAsync);
  return 0;
}
CUresult cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim, const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  COUNT(kTensorMapEncodeTiled);
  uint64_t words[16] = {(uint64_t)(uintptr_t)globalAddress, tensorDataType, tensorRank, globalDim[0], boxDim[0], swizzle};
  memcpy(tensorMap, words, sizeof words);
  return 0;
}
CUresult cuTensorMapEncodeIm2col(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const int* pixelBoxLowerCorner, const int* pixelBoxUpperCorner, cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn, const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  COUNT(kTensorMapEncodeIm2col);
  uint64_t words[16] = {(uint64_t)(uintptr_t)globalAddress, tensorDataType, tensorRank, globalDim[0], channelsPerPixel, swizzle};
  memcpy(tensorMap, words, sizeof words);
  return 0;
}
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { COUNT(kGraphLaunch); return 0; }
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) { COUNT(kStreamIsCapturing); *captureStatus = g_capturing; return 0; }
CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) { COUNT(kEventCreate); *phEvent = calloc(1, sizeof(struct CUevent_st)); return *phEvent ? 0 : 2; }
CUresult cuEventRecord(CUevent hEvent, CUstream hStream) { COUNT(kEventRecord); hEvent->pending = g_hold ? g_generation : 0; return 0; }
CUresult cuEventQuery(CUevent hEvent) { COUNT(kEventQuery); return event_pending(hEvent) ? 600 : 0; }  // CUDA_ERROR_NOT_READY
CUresult cuEventSynchronize(CUevent hEvent) { COUNT(kEventSynchronize); hEvent->pending = 0; return 0; }
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) { COUNT(kThreadExchangeStreamCaptureMode); return 0; }
