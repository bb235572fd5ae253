/* The emulated machine's devices, primary contexts, versions, error names and fault injection. */
#include "emu.h"
#include "schedule.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <time.h>

namespace emu {

namespace {
/* Never destroyed (allocated once, never freed), so a call made while the process exits still
 * finds them. */
std::mutex& g_lock = *new std::mutex(); /* devices, contexts and faults */
Machine g_machine;
std::atomic<bool> g_initialized{false};
/* One live primary context per device (null if released). */
std::vector<Context*>& g_primary = *new std::vector<Context*>();
/* Every context ever made (alive or destroyed). */
std::set<Context*>& g_contexts = *new std::set<Context*>();
thread_local std::vector<Context*> t_stack;

struct Fault {
  std::string name;
  int device = -1;
  CUresult code = CUDA_ERROR_UNKNOWN;
};
std::vector<Fault>& g_faults = *new std::vector<Fault>();

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi) {
    fprintf(stderr, "emulated CUDA driver: %s=%s is not an integer in [%d, %d]; using %d\n", name,
            v, lo, hi, fallback);
    return fallback;
  }
  return (int)x;
}

void parse_faults() {
  const char* v = getenv("STRAGGLAR_EMU_FAIL");
  if (!v) return;
  std::string all(v);
  size_t at = 0;
  while (at <= all.size()) {
    size_t comma = all.find(',', at);
    std::string item = all.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? all.size() + 1 : comma + 1;
    if (item.empty()) continue;
    Fault f;
    size_t eq = item.find('=');
    if (eq != std::string::npos) {
      f.code = (CUresult)atoi(item.c_str() + eq + 1);
      item.resize(eq);
    }
    size_t dev = item.find('@');
    if (dev != std::string::npos) {
      f.device = atoi(item.c_str() + dev + 1);
      item.resize(dev);
    }
    f.name = item;
    g_faults.push_back(f);
  }
}
}  // namespace

const Machine& machine() { return g_machine; }
bool initialized() { return g_initialized.load(std::memory_order_acquire); }

uint64_t now_ns() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

CUresult injected(const char* name) {
  std::lock_guard<std::mutex> g(g_lock);
  for (const Fault& f : g_faults) {
    if (f.name != name) continue;
    if (f.device >= 0) {
      Context* c = t_stack.empty() ? nullptr : t_stack.back();
      if (!c || c->device != f.device) continue;
    }
    return f.code;
  }
  return CUDA_SUCCESS;
}

Context* current_context() { return t_stack.empty() ? nullptr : t_stack.back(); }

CUresult require_context(Context** out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (int fault = c->fault.load()) return (CUresult)fault;
  *out = c;
  return CUDA_SUCCESS;
}

bool is_context(Context* ctx) {
  std::lock_guard<std::mutex> g(g_lock);
  return g_contexts.count(ctx) != 0;
}

}  // namespace emu

using namespace emu;

static CUresult check_device(CUdevice d) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (d < 0 || d >= machine().devices) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

extern "C" {

CUresult cuInit(unsigned int flags) {
  EMU_FAULT("cuInit");
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(g_lock);
  if (!g_initialized.load()) {
    g_machine.devices = env_int("STRAGGLAR_EMU_GPUS", 8, 0, 64);
    g_machine.sms = env_int("STRAGGLAR_EMU_SMS", 32, 1, 1024);
    g_machine.multicast = env_int("STRAGGLAR_EMU_MULTICAST", 0, 0, 1);
    g_machine.driver_version = env_int("STRAGGLAR_EMU_DRIVER_VERSION", 13000, 1000, 99999);
    g_primary.assign(g_machine.devices, nullptr);
    parse_faults();
    if (schedule_seed())
      fprintf(stderr, "emulated GPU: scheduling seed %llu (STRAGGLAR_EMU_SEED)\n",
              (unsigned long long)schedule_seed());
    g_initialized.store(true, std::memory_order_release);
  }
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  EMU_FAULT("cuDriverGetVersion");
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  /* Like the real driver, this answers before cuInit. */
  *version = env_int("STRAGGLAR_EMU_DRIVER_VERSION", 13000, 1000, 99999);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  EMU_FAULT("cuDeviceGetCount");
  EMU_REQUIRE_INIT();
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = machine().devices;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  EMU_FAULT("cuDeviceGet");
  EMU_REQUIRE_INIT();
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= machine().devices) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  EMU_FAULT("cuDeviceGetName");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "Stragglar emulated GPU");
  return CUDA_SUCCESS;
}

/* The same UUID in every process: "SGEMU" and the ordinal. */
CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice d) {
  EMU_FAULT("cuDeviceGetUuid_v2");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  memset(uuid->bytes, 0, sizeof(uuid->bytes));
  memcpy(uuid->bytes, "SGEMU-GPU", 9);
  uuid->bytes[15] = (char)d;
  return CUDA_SUCCESS;
}

#undef cuDeviceGetUuid
CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice d) {
  EMU_FAULT("cuDeviceGetUuid");
  return cuDeviceGetUuid_v2(uuid, d);
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  EMU_FAULT("cuDeviceTotalMem_v2");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = machine().memory_bytes;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* id, int len, CUdevice d) {
  EMU_FAULT("cuDeviceGetPCIBusId");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(id, (size_t)len, "0000:%02x:00.0", 0x10 + d);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice d) {
  EMU_FAULT("cuDeviceGetAttribute");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if ((int)attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  int v = 0;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = machine().sms; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = CU_COMPUTEMODE_DEFAULT; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x10 + d; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 6144; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 2; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    /* Scaled down with the multiprocessors (an H100's is 50 MiB for 132): 4 MiB. */
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 4 << 20; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: v = machine().multicast; break;
    default: v = 0; break;
  }
  *value = v;
  return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice d) {
  EMU_FAULT("cuDeviceComputeCapability");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
  *major = 9;
  *minor = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attribute, CUdevice src,
                                 CUdevice dst) {
  EMU_FAULT("cuDeviceGetP2PAttribute");
  CUresult r = check_device(src);
  if (r == CUDA_SUCCESS) r = check_device(dst);
  if (r != CUDA_SUCCESS) return r;
  if (!value || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = 0; break;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *value = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice d, CUdevice peer) {
  EMU_FAULT("cuDeviceCanAccessPeer");
  CUresult r = check_device(d);
  if (r == CUDA_SUCCESS) r = check_device(peer);
  if (r != CUDA_SUCCESS) return r;
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  *can = d != peer ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice d) {
  EMU_FAULT("cuDevicePrimaryCtxRetain");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(g_lock);
  Context* c = g_primary[d];
  if (!c) {
    c = new Context();
    c->device = d;
    c->connections = env_int("CUDA_DEVICE_MAX_CONNECTIONS", 8, 1, 32);
    g_primary[d] = c;
    g_contexts.insert(c);
  }
  c->retains++;
  *pctx = (CUcontext)c;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  EMU_FAULT("cuDevicePrimaryCtxRelease_v2");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(g_lock);
  Context* c = g_primary[d];
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c->retains == 0) {
    /* Destroyed: its handle stays known (so uses answer CONTEXT_IS_DESTROYED) and its
     * resources are left to the process (the emulation never reuses an address). */
    c->alive = false;
    g_primary[d] = nullptr;
  }
  return CUDA_SUCCESS;
}

#undef cuDevicePrimaryCtxRelease
CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
  EMU_FAULT("cuDevicePrimaryCtxRelease");
  return cuDevicePrimaryCtxRelease_v2(d);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* flags, int* active) {
  EMU_FAULT("cuDevicePrimaryCtxGetState");
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(g_lock);
  *flags = 0;
  *active = g_primary[d] != nullptr ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  EMU_FAULT("cuCtxSetCurrent");
  EMU_REQUIRE_INIT();
  Context* c = (Context*)ctx;
  if (c && !is_context(c)) return CUDA_ERROR_INVALID_CONTEXT;
  if (c && !c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (!c) {
    if (!t_stack.empty()) t_stack.pop_back();
  } else if (t_stack.empty()) {
    t_stack.push_back(c);
  } else {
    t_stack.back() = c;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  EMU_FAULT("cuCtxGetCurrent");
  EMU_REQUIRE_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = (CUcontext)current_context();
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  EMU_FAULT("cuCtxPushCurrent_v2");
  EMU_REQUIRE_INIT();
  Context* c = (Context*)ctx;
  if (!c || !is_context(c)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  t_stack.push_back(c);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  EMU_FAULT("cuCtxPopCurrent_v2");
  EMU_REQUIRE_INIT();
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = (CUcontext)t_stack.back();
  t_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  EMU_FAULT("cuCtxGetDevice");
  Context* c = nullptr;
  CUresult r = require_context(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = c->device;
  return CUDA_SUCCESS;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
static const ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "illegal state"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
     "capture was not initiated in this stream"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE",
     "operation would have resulted in a merge of two independent capture sequences"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
     "capturing stream has unjoined work"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
     "dependency created on uncaptured work in another stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult cuGetErrorName(CUresult error, const char** name) {
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& e : kErrors) {
    if (e.code == error) {
      *name = e.name;
      return CUDA_SUCCESS;
    }
  }
  *name = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& e : kErrors) {
    if (e.code == error) {
      *text = e.text;
      return CUDA_SUCCESS;
    }
  }
  *text = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

}  // extern "C"

extern "C" {

/* The driver's private tables (NVRTC asks for them when a driver is loaded): the emulated
 * driver has none, and says so. */
CUresult cuGetExportTable(const void** table, const CUuuid* id) {
  EMU_FAULT("cuGetExportTable");
  if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
  *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // extern "C"
