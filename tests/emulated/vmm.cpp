/* The virtual memory API and multicast objects. A physical allocation (cuMemCreate) or a
 * multicast object (cuMulticastCreate) is a memfd whose first page, its Meta, every process
 * holding it shares; an allocation's bytes follow, then their shadow and their history (see
 * memory.cpp: stale loads, and multimem stores remembered as landed through the proxy). Shareable
 * handles are real file descriptors (dups of the memfd), passed between processes as a program
 * passes any fd, and imported by reading the Meta behind them.
 *
 * What a GPU would do and this machine does too:
 * - sizes, offsets and addresses are multiples of the granularity (2 MiB, minimum and
 *   recommended alike), else CUDA_ERROR_INVALID_VALUE;
 * - mapped memory is reachable only once cuMemSetAccess grants it (before, copies answer
 *   CUDA_ERROR_INVALID_VALUE and a kernel's access faults the process);
 * - cuMulticastBindMem and cuMemMap of a multicast object block until every device the object
 *   was created for has been added, in whichever process adds it (after 10 s a line on stderr
 *   says what they wait for, and they go on waiting, as the driver does);
 * - a multicast mapping is never plain memory: its pages stay inaccessible, and a plain load
 *   or store to them ends the process with a line naming the address (undefined in PTX);
 * - multicast needs STRAGGLAR_EMU_MULTICAST=1 (else CUDA_ERROR_NOT_SUPPORTED); fabric handles
 *   are not supported (no IMEX channel here);
 * - the machine's multicast objects are few (an NVSwitch's, which NCCL's NVLS uses too):
 *   STRAGGLAR_EMU_MULTICAST_OBJECTS (default 64) live objects at most over every process,
 *   counted by the locks their creators hold on files of their own in
 *   /dev/shm/stragglar-emu-multicast-<uid> (a crashed process's lock goes with it); a create
 *   beyond them fails with CUDA_ERROR_OUT_OF_MEMORY.
 * - a multimem store (the kernels' sg_multimem_store16) writes every member's memory bound at
 *   its offset, in whichever process it lives (opened through /proc/<pid>/fd, as IPC is, and
 *   kept mapped); it lands at once, never held back as the weak memory holds plain stores;
 *   STRAGGLAR_EMU_MULTICAST_DROP=D makes them never reach device D's memory (a switch that does
 *   not replicate to one GPU, for the multicast team's probe). */
#include "emu.h"
#include "kernel_source.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <dirent.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace emu {
namespace {

constexpr size_t kGranularity = size_t(2) << 20;
constexpr size_t kMetaBytes = 4096;
constexpr uint32_t kMetaMagic = 0x4d4d4753; /* "SGMM" */
constexpr int kTeam = 64;
enum : uint32_t { kAllocation = 1, kMulticast = 2 };

/* One device's memory bound into a multicast object: the allocation's memfd as the binding
 * process holds it (so a peer could open /proc/<pid>/fd/<fd>), and the ranges bound. */
struct Binding {
  int32_t device;
  int32_t fd;
  int64_t pid;
  uint64_t ino;
  uint64_t mem_offset, mc_offset, size;
};

/* The first page of every memfd of this file, shared by every process holding it. */
struct Meta {
  uint32_t magic, kind;
  uint64_t bytes;        /* an allocation's bytes; a multicast object's size per device */
  uint64_t handle_types; /* the shareable handle types asked for at creation */
  int32_t device;        /* an allocation's device */
  uint32_t num_devices;  /* a multicast object's team size */
  uint32_t lock;         /* a spin lock across processes, over what follows */
  uint32_t added;        /* devices added so far; read without the lock by waiters */
  int32_t team[kTeam];
  uint32_t bindings;
  Binding bound[kTeam];
};
static_assert(sizeof(Meta) <= kMetaBytes, "the Meta fits its page");

/* Holds a Meta's lock (a spin across processes; every holder runs a few instructions). */
struct MetaLock {
  Meta* meta;
  explicit MetaLock(Meta* m) : meta(m) {
    while (__atomic_exchange_n(&meta->lock, 1u, __ATOMIC_ACQUIRE) != 0) sched_yield();
  }
  ~MetaLock() { __atomic_store_n(&meta->lock, 0u, __ATOMIC_RELEASE); }
};

/* A handle of this process: its own dup of the memfd and its Meta mapped. Gone once released
 * and no longer mapped. */
struct Handle {
  int fd = -1;
  uint64_t ino = 0;
  Meta* meta = nullptr;
  bool imported = false;
  bool released = false;
  int mappings = 0;
  /* A multicast object this process created: the lock file that counts it (-1 otherwise). */
  int counted = -1;
  std::string counted_path;
};

/* A mapped range: of an allocation (data mapped from the memfd, shadow mapped apart, recorded
 * as device memory once accessible) or of a multicast object (pages left inaccessible). */
struct Mapping {
  size_t bytes = 0;
  size_t offset = 0; /* into the handle's memory (cuMemMap's offset) */
  uint64_t handle = 0;
  bool multicast = false;
  int device = 0;
  uint32_t* shadow = nullptr;
  /* The history of the mapped bytes (memory.cpp), mapped apart as the shadow is. */
  void* history = nullptr;
  bool accessible = false;
};

std::mutex* g_vmm = new std::mutex();
std::map<uint64_t, Handle>* g_handles = new std::map<uint64_t, Handle>();
std::map<uint64_t, size_t>* g_reservations = new std::map<uint64_t, size_t>();
std::map<uint64_t, Mapping>* g_mappings = new std::map<uint64_t, Mapping>();
uint64_t g_next_handle = 0x5347000000000001ull;

/* The multicast ranges of this process, read by the fault handler without a lock: start and
 * end per slot, 0 when free. */
constexpr int kMulticastRanges = 64;
std::atomic<uint64_t> g_mc_start[kMulticastRanges];
std::atomic<uint64_t> g_mc_end[kMulticastRanges];
struct sigaction g_previous_segv;
std::once_flag g_segv_once;

void on_segv(int sig, siginfo_t* info, void* context) {
  const uint64_t at = (uint64_t)info->si_addr;
  for (int i = 0; i < kMulticastRanges; ++i) {
    const uint64_t start = g_mc_start[i].load(std::memory_order_acquire);
    if (start != 0 && at >= start && at < g_mc_end[i].load(std::memory_order_acquire)) {
      char text[256];
      const int n = snprintf(text, sizeof text,
                             "emulated GPU: a plain load or store to the multicast address "
                             "0x%llx (offset 0x%llx of its mapping): undefined on a GPU, where "
                             "only multimem operations may use a multicast address\n",
                             (unsigned long long)at, (unsigned long long)(at - start));
      if (n > 0) (void)!write(2, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
      abort();
    }
  }
  /* Not ours: the fault repeats under the handler there was before. */
  sigaction(SIGSEGV, &g_previous_segv, nullptr);
  (void)sig;
  (void)context;
}

void watch_multicast_range(uint64_t start, size_t bytes) {
  std::call_once(g_segv_once, [] {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous_segv);
  });
  for (int i = 0; i < kMulticastRanges; ++i) {
    uint64_t free_slot = 0;
    if (g_mc_start[i].compare_exchange_strong(free_slot, start)) {
      g_mc_end[i].store(start + bytes, std::memory_order_release);
      return;
    }
  }
}

void forget_multicast_range(uint64_t start) {
  for (int i = 0; i < kMulticastRanges; ++i)
    if (g_mc_start[i].load() == start) {
      g_mc_end[i].store(0);
      g_mc_start[i].store(0);
    }
}

bool aligned(uint64_t x) { return x % kGranularity == 0; }

CUresult check_device_ordinal(int device) {
  return device >= 0 && device < machine().devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* The checks every allocation property gets: pinned device memory on a device of this
 * machine, shareable as nothing or as a POSIX fd. */
CUresult check_allocation_prop(const CUmemAllocationProp* prop) {
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = check_device_ordinal(prop->location.id);
  if (r != CUDA_SUCCESS) return r;
  if (prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

CUresult check_multicast_prop(const CUmulticastObjectProp* prop) {
  if (!machine().multicast) return CUDA_ERROR_NOT_SUPPORTED;
  if (!prop || prop->numDevices == 0 || prop->flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->numDevices > (unsigned)kTeam) return CUDA_ERROR_OUT_OF_MEMORY;
  if (prop->handleTypes & ~(unsigned long long)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

CUresult forbid_in_capture() {
  std::lock_guard<std::mutex> g(capture_lock());
  return unsafe_call_forbidden() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* Under g_vmm: records a handle on `fd` (which it now owns), its Meta mapped. */
CUresult add_handle(int fd, bool imported, CUmemGenericAllocationHandle* out) {
  struct stat st;
  void* meta = fstat(fd, &st) == 0 ? mmap(nullptr, kMetaBytes, PROT_READ | PROT_WRITE,
                                          MAP_SHARED, fd, 0)
                                   : MAP_FAILED;
  if (meta == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Handle h;
  h.fd = fd;
  h.ino = (uint64_t)st.st_ino;
  h.meta = (Meta*)meta;
  h.imported = imported;
  const uint64_t id = g_next_handle++;
  (*g_handles)[id] = h;
  *out = id;
  return CUDA_SUCCESS;
}

/* Under g_vmm: the live handle `id` (not released), or null. */
Handle* live_handle(uint64_t id) {
  auto it = g_handles->find(id);
  return it == g_handles->end() || it->second.released ? nullptr : &it->second;
}

/* Under g_vmm: drops the handle once released and unmapped. */
void drop_if_done(uint64_t id) {
  auto it = g_handles->find(id);
  if (it == g_handles->end() || !it->second.released || it->second.mappings > 0) return;
  munmap(it->second.meta, kMetaBytes);
  close(it->second.fd);
  if (it->second.counted >= 0) {
    unlink(it->second.counted_path.c_str());
    close(it->second.counted);
  }
  g_handles->erase(it);
}

/* The directory of the machine's multicast objects' lock files (made on first use). */
std::string multicast_objects_dir() {
  const std::string dir = "/dev/shm/stragglar-emu-multicast-" + std::to_string(getuid());
  mkdir(dir.c_str(), 0700);
  return dir;
}

/* Counts one more multicast object of the machine, unless STRAGGLAR_EMU_MULTICAST_OBJECTS are
 * live already: the held lock file that counts it (its path in `path`), or -1. The count and
 * the new file are made under a lock of the whole directory, so two processes never both take
 * the last object. */
int count_multicast_object(std::string* path) {
  static const int limit = [] {
    const char* v = getenv("STRAGGLAR_EMU_MULTICAST_OBJECTS");
    return v && *v ? atoi(v) : 64;
  }();
  static std::atomic<uint64_t> next{0};
  const std::string dir = multicast_objects_dir();
  const int all = open((dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (all < 0 || flock(all, LOCK_EX) != 0) {
    if (all >= 0) close(all);
    return -1;
  }
  int live = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string file = dir + "/" + e->d_name;
      const int fd = open(file.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;
      if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        unlink(file.c_str()); /* its creator is gone */
      else
        live++;
      close(fd);
    }
    closedir(d);
  }
  int mine = -1;
  if (live < limit) {
    *path = dir + "/" + std::to_string(getpid()) + "-" + std::to_string(next++);
    mine = open(path->c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (mine >= 0 && flock(mine, LOCK_EX | LOCK_NB) != 0) {
      close(mine);
      mine = -1;
    }
  }
  close(all);
  return mine;
}

/* Blocks until every device of the multicast object has been added, as the driver's binds and
 * maps do; says once on stderr, after 10 s, what it waits for. */
void wait_for_team(const Meta* meta, const char* call) {
  const uint64_t start = now_ns();
  bool said = false;
  while (__atomic_load_n(&meta->added, __ATOMIC_ACQUIRE) < meta->num_devices) {
    if (!said && now_ns() - start > 10'000'000'000ull) {
      said = true;
      fprintf(stderr,
              "emulated GPU: %s waits for a multicast object's devices to be added (%u of %u "
              "so far): a real driver blocks here until they are\n",
              call, __atomic_load_n(&meta->added, __ATOMIC_ACQUIRE), meta->num_devices);
    }
    usleep(1000);
  }
}

/* Puts reserved, inaccessible addresses back over [p, p + bytes) where a mapping was. */
void restore_reservation(uint64_t p, size_t bytes) {
  mmap((void*)p, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
       0);
}

/* Under g_vmm: the mapping holding `p`, or end(). */
std::map<uint64_t, Mapping>::iterator mapping_at(uint64_t p) {
  auto it = g_mappings->upper_bound(p);
  if (it == g_mappings->begin()) return g_mappings->end();
  --it;
  return p < it->first + it->second.bytes ? it : g_mappings->end();
}

/* Under g_vmm: whether [p, p + bytes) lies inside one reservation. */
bool reserved(uint64_t p, size_t bytes) {
  auto it = g_reservations->upper_bound(p);
  if (it == g_reservations->begin()) return false;
  --it;
  return p + bytes <= it->first + it->second;
}

/* Under g_vmm: the mappings exactly tiling [p, p + bytes), or an empty list if they don't. */
std::vector<std::map<uint64_t, Mapping>::iterator> tiling(uint64_t p, size_t bytes) {
  std::vector<std::map<uint64_t, Mapping>::iterator> out;
  uint64_t at = p;
  while (at < p + bytes) {
    auto it = g_mappings->find(at);
    if (it == g_mappings->end() || at + it->second.bytes > p + bytes) return {};
    out.push_back(it);
    at += it->second.bytes;
  }
  return out;
}

/* An allocation's bytes and their history, as one process maps them. */
struct MemberMemory {
  unsigned char* data = nullptr;
  void* history = nullptr;
};

/* Where an allocation of `bytes` keeps its history in its memfd: after its bytes and shadow. */
off_t history_offset(size_t bytes) { return (off_t)(kMetaBytes + 2 * bytes); }

/* Under g_vmm: the bytes of the allocation a binding names and their history, mapped in this
 * process (opened through /proc/<pid>/fd/<fd> of the binding process once, and kept); null
 * data if it is gone. */
MemberMemory binding_memory(const Binding& b) {
  static std::map<std::pair<int64_t, uint64_t>, MemberMemory>* mapped =
      new std::map<std::pair<int64_t, uint64_t>, MemberMemory>();
  const auto key = std::make_pair(b.pid, b.ino);
  auto it = mapped->find(key);
  if (it != mapped->end()) return it->second;
  char path[64];
  snprintf(path, sizeof path, "/proc/%lld/fd/%d", (long long)b.pid, b.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat st;
  Meta meta;
  void* p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && (uint64_t)st.st_ino == b.ino &&
      pread(fd, &meta, sizeof meta, 0) == (ssize_t)sizeof meta && meta.magic == kMetaMagic)
    p = mmap(nullptr, (size_t)history_offset(meta.bytes) + history_bytes_of(meta.bytes),
             PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return {};
  MemberMemory member;
  member.data = (unsigned char*)p + kMetaBytes;
  member.history = (unsigned char*)p + history_offset(meta.bytes);
  (*mapped)[key] = member;
  return member;
}

}  // namespace

bool is_multicast_address(const void* p, uint32_t n) {
  const uint64_t at = (uint64_t)p;
  std::lock_guard<std::mutex> g(*g_vmm);
  auto it = mapping_at(at);
  return it != g_mappings->end() && it->second.multicast && it->second.accessible &&
         at + n <= it->first + it->second.bytes;
}

bool multicast_store(void* p, const void* src, uint32_t n, uint64_t stored_at) {
  static const int dropped = [] {
    const char* v = getenv("STRAGGLAR_EMU_MULTICAST_DROP");
    return v && *v ? atoi(v) : -1;
  }();
  const uint64_t at = (uint64_t)p;
  std::lock_guard<std::mutex> g(*g_vmm);
  auto it = mapping_at(at);
  if (it == g_mappings->end() || !it->second.multicast || !it->second.accessible ||
      at + n > it->first + it->second.bytes)
    return false;
  auto h = g_handles->find(it->second.handle);
  if (h == g_handles->end()) return false;
  Meta* meta = h->second.meta;
  const uint64_t offset = it->second.offset + (at - it->first);
  MetaLock lock(meta);
  for (uint32_t i = 0; i < meta->bindings; ++i) {
    const Binding& b = meta->bound[i];
    if (offset < b.mc_offset || offset + n > b.mc_offset + b.size || b.device == dropped)
      continue;
    const MemberMemory memory = binding_memory(b);
    if (!memory.data) return false;
    unsigned char* dst = memory.data + b.mem_offset + (offset - b.mc_offset);
    land_multimem(dst, src, n, stored_at, memory.data, memory.history);
  }
  return true;
}

}  // namespace emu

using namespace emu;

extern "C" {

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  EMU_FAULT("cuMemGetAllocationGranularity");
  EMU_REQUIRE_INIT();
  CUresult r = check_allocation_prop(prop);
  if (r != CUDA_SUCCESS) return r;
  if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                       option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  EMU_FAULT("cuMemCreate");
  EMU_REQUIRE_INIT();
  CUresult r = check_allocation_prop(prop);
  if (r != CUDA_SUCCESS) return r;
  if (!handle || flags != 0 || size == 0 || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
  r = forbid_in_capture();
  if (r != CUDA_SUCCESS) return r;
  int fd = memfd_create("stragglar-emulated-vmm", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, history_offset(size) + (off_t)history_bytes_of(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::lock_guard<std::mutex> g(*g_vmm);
  r = add_handle(fd, false, handle);
  if (r != CUDA_SUCCESS) return r;
  Meta* meta = (*g_handles)[*handle].meta;
  meta->kind = kAllocation;
  meta->bytes = size;
  meta->handle_types = prop->requestedHandleTypes;
  meta->device = prop->location.id;
  __atomic_store_n(&meta->magic, kMetaMagic, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  EMU_FAULT("cuMemRelease");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(*g_vmm);
  Handle* h = live_handle(handle);
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  h->released = true;
  drop_if_done(handle);
  return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type, unsigned long long flags) {
  EMU_FAULT("cuMemExportToShareableHandle");
  EMU_REQUIRE_INIT();
  if (!shareable || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> g(*g_vmm);
  Handle* h = live_handle(handle);
  if (!h || !(h->meta->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *(int*)shareable = fd;
  return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                        CUmemAllocationHandleType type) {
  EMU_FAULT("cuMemImportFromShareableHandle");
  EMU_REQUIRE_INIT();
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int given = (int)(intptr_t)os_handle;
  Meta probe;
  if (pread(given, &probe, sizeof probe, 0) != (ssize_t)sizeof probe ||
      probe.magic != kMetaMagic)
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> g(*g_vmm);
  return add_handle(fd, true, handle);
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  EMU_FAULT("cuMemAddressReserve");
  EMU_REQUIRE_INIT();
  if (!ptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t align = alignment > kGranularity ? alignment : kGranularity;
  /* Over-reserve, keep an aligned window (the hint `addr` is only a hint, as the driver's). */
  (void)addr;
  const size_t span = size + align;
  void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uint64_t base = ((uint64_t)p + align - 1) / align * align;
  if (base > (uint64_t)p) munmap(p, base - (uint64_t)p);
  const uint64_t end = (uint64_t)p + span;
  if (end > base + size) munmap((void*)(base + size), end - (base + size));
  std::lock_guard<std::mutex> g(*g_vmm);
  (*g_reservations)[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  EMU_FAULT("cuMemAddressFree");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(*g_vmm);
  auto it = g_reservations->find(ptr);
  if (it == g_reservations->end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto first = g_mappings->lower_bound(ptr);
  if (first != g_mappings->end() && first->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  munmap((void*)ptr, size);
  g_reservations->erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  EMU_FAULT("cuMemMap");
  EMU_REQUIRE_INIT();
  if (flags != 0 || size == 0 || !aligned(ptr) || !aligned(size) || !aligned(offset))
    return CUDA_ERROR_INVALID_VALUE;
  const Meta* waiting_on = nullptr;
  {
    std::lock_guard<std::mutex> g(*g_vmm);
    Handle* h = live_handle(handle);
    if (!h) return CUDA_ERROR_INVALID_HANDLE;
    if (h->meta->kind == kMulticast) waiting_on = h->meta;
  }
  /* Outside the lock: the device that completes the team may be added by this process. */
  if (waiting_on) wait_for_team(waiting_on, "cuMemMap");
  std::lock_guard<std::mutex> g(*g_vmm);
  Handle* h = live_handle(handle);
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  if (!reserved(ptr, size) || offset + size > h->meta->bytes) return CUDA_ERROR_INVALID_VALUE;
  auto next = g_mappings->lower_bound(ptr);
  if (mapping_at(ptr) != g_mappings->end() ||
      (next != g_mappings->end() && next->first < ptr + size))
    return CUDA_ERROR_INVALID_VALUE;
  Mapping m;
  m.bytes = size;
  m.offset = offset;
  m.handle = handle;
  m.multicast = h->meta->kind == kMulticast;
  m.device = h->meta->device;
  if (!m.multicast) {
    const off_t data = (off_t)(kMetaBytes + offset);
    if (mmap((void*)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, data) == MAP_FAILED)
      return CUDA_ERROR_OUT_OF_MEMORY;
    void* shadow = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd,
                        (off_t)(kMetaBytes + h->meta->bytes + offset));
    /* Offsets are multiples of the granularity, so the history's is a multiple of a page. */
    void* history = shadow == MAP_FAILED
                        ? MAP_FAILED
                        : mmap(nullptr, history_bytes_of(size), PROT_READ | PROT_WRITE,
                               MAP_SHARED, h->fd,
                               history_offset(h->meta->bytes) +
                                   (off_t)history_bytes_of(offset));
    if (shadow == MAP_FAILED || history == MAP_FAILED) {
      if (shadow != MAP_FAILED) munmap(shadow, size);
      restore_reservation(ptr, size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m.shadow = (uint32_t*)shadow;
    m.history = history;
  } else {
    watch_multicast_range(ptr, size);
  }
  h->mappings++;
  (*g_mappings)[ptr] = m;
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  EMU_FAULT("cuMemUnmap");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(*g_vmm);
  auto tiles = tiling(ptr, size);
  if (tiles.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (auto it : tiles) {
    const uint64_t at = it->first;
    Mapping& m = it->second;
    if (m.multicast) {
      forget_multicast_range(at);
    } else {
      remove_mapped_memory(at);
      munmap(m.shadow, m.bytes);
      munmap(m.history, history_bytes_of(m.bytes));
      restore_reservation(at, m.bytes);
    }
    const uint64_t handle = m.handle;
    g_mappings->erase(it);
    auto h = g_handles->find(handle);
    if (h != g_handles->end()) h->second.mappings--;
    drop_if_done(handle);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  EMU_FAULT("cuMemSetAccess");
  EMU_REQUIRE_INIT();
  if (!desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_device_ordinal(desc[i].location.id);
    if (r != CUDA_SUCCESS) return r;
    switch (desc[i].flags) {
      case CU_MEM_ACCESS_FLAGS_PROT_NONE: break;
      case CU_MEM_ACCESS_FLAGS_PROT_READ: prot |= PROT_READ; break;
      case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: prot |= PROT_READ | PROT_WRITE; break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  std::lock_guard<std::mutex> g(*g_vmm);
  auto tiles = tiling(ptr, size);
  if (tiles.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (auto it : tiles) {
    Mapping& m = it->second;
    m.accessible = prot != PROT_NONE;
    if (m.multicast) continue; /* its pages stay inaccessible to plain accesses */
    if (mprotect((void*)it->first, m.bytes, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
    remove_mapped_memory(it->first);
    if (m.accessible) add_mapped_memory(it->first, m.bytes, m.device, m.shadow, m.history);
  }
  return CUDA_SUCCESS;
}

CUresult cuMulticastGetGranularity(size_t* granularity, const CUmulticastObjectProp* prop,
                                   CUmulticastGranularity_flags option) {
  EMU_FAULT("cuMulticastGetGranularity");
  EMU_REQUIRE_INIT();
  CUresult r = check_multicast_prop(prop);
  if (r != CUDA_SUCCESS) return r;
  if (!granularity ||
      (option != CU_MULTICAST_GRANULARITY_MINIMUM && option != CU_MULTICAST_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMulticastCreate(CUmemGenericAllocationHandle* handle,
                           const CUmulticastObjectProp* prop) {
  EMU_FAULT("cuMulticastCreate");
  EMU_REQUIRE_INIT();
  CUresult r = check_multicast_prop(prop);
  if (r != CUDA_SUCCESS) return r;
  if (!handle || prop->size == 0 || !aligned(prop->size)) return CUDA_ERROR_INVALID_VALUE;
  std::string counted_path;
  const int counted = count_multicast_object(&counted_path);
  if (counted < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = memfd_create("stragglar-emulated-multicast", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)kMetaBytes) != 0) {
    if (fd >= 0) close(fd);
    unlink(counted_path.c_str());
    close(counted);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::lock_guard<std::mutex> g(*g_vmm);
  r = add_handle(fd, false, handle);
  if (r != CUDA_SUCCESS) {
    unlink(counted_path.c_str());
    close(counted);
    return r;
  }
  (*g_handles)[*handle].counted = counted;
  (*g_handles)[*handle].counted_path = counted_path;
  Meta* meta = (*g_handles)[*handle].meta;
  meta->kind = kMulticast;
  meta->bytes = prop->size;
  meta->handle_types = prop->handleTypes;
  meta->device = -1;
  meta->num_devices = prop->numDevices;
  __atomic_store_n(&meta->magic, kMetaMagic, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mc, CUdevice dev) {
  EMU_FAULT("cuMulticastAddDevice");
  EMU_REQUIRE_INIT();
  CUresult r = check_device_ordinal(dev);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(*g_vmm);
  Handle* h = live_handle(mc);
  if (!h || h->meta->kind != kMulticast) return CUDA_ERROR_INVALID_VALUE;
  Meta* meta = h->meta;
  MetaLock lock(meta);
  const uint32_t added = __atomic_load_n(&meta->added, __ATOMIC_RELAXED);
  if (added >= meta->num_devices) return CUDA_ERROR_INVALID_VALUE;
  for (uint32_t i = 0; i < added; ++i)
    if (meta->team[i] == dev) return CUDA_ERROR_INVALID_VALUE;
  meta->team[added] = dev;
  __atomic_store_n(&meta->added, added + 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                            CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                            unsigned long long flags) {
  EMU_FAULT("cuMulticastBindMem");
  EMU_REQUIRE_INIT();
  if (flags != 0 || size == 0 || !aligned(size) || !aligned(mc_offset) || !aligned(mem_offset))
    return CUDA_ERROR_INVALID_VALUE;
  const Meta* waiting_on = nullptr;
  {
    std::lock_guard<std::mutex> g(*g_vmm);
    Handle* h = live_handle(mc);
    if (!h || h->meta->kind != kMulticast) return CUDA_ERROR_INVALID_VALUE;
    waiting_on = h->meta;
  }
  wait_for_team(waiting_on, "cuMulticastBindMem");
  std::lock_guard<std::mutex> g(*g_vmm);
  Handle* group = live_handle(mc);
  Handle* memory = live_handle(mem);
  if (!group || group->meta->kind != kMulticast || !memory ||
      memory->meta->kind != kAllocation)
    return CUDA_ERROR_INVALID_VALUE;
  Meta* meta = group->meta;
  if (mc_offset + size > meta->bytes || mem_offset + size > memory->meta->bytes)
    return CUDA_ERROR_INVALID_VALUE;
  /* Shareable or imported multicast objects bind only shareable memory. */
  if ((meta->handle_types != 0 || group->imported) && memory->meta->handle_types == 0)
    return CUDA_ERROR_INVALID_VALUE;
  const int device = memory->meta->device;
  MetaLock lock(meta);
  bool in_team = false;
  for (uint32_t i = 0; i < meta->num_devices; ++i) in_team |= meta->team[i] == device;
  if (!in_team) return CUDA_ERROR_INVALID_DEVICE;
  for (uint32_t i = 0; i < meta->bindings; ++i) {
    const Binding& b = meta->bound[i];
    if (b.device == device && mc_offset < b.mc_offset + b.size && b.mc_offset < mc_offset + size)
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (meta->bindings >= (uint32_t)kTeam) return CUDA_ERROR_OUT_OF_MEMORY;
  Binding& b = meta->bound[meta->bindings++];
  b.device = device;
  b.fd = memory->fd;
  b.pid = (int64_t)getpid();
  b.ino = memory->ino;
  b.mem_offset = mem_offset;
  b.mc_offset = mc_offset;
  b.size = size;
  return CUDA_SUCCESS;
}

CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_offset,
                           size_t size) {
  EMU_FAULT("cuMulticastUnbind");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(*g_vmm);
  Handle* h = live_handle(mc);
  if (!h || h->meta->kind != kMulticast) return CUDA_ERROR_INVALID_VALUE;
  Meta* meta = h->meta;
  MetaLock lock(meta);
  for (uint32_t i = 0; i < meta->bindings; ++i) {
    Binding& b = meta->bound[i];
    if (b.device == dev && b.mc_offset == mc_offset && b.size == size) {
      b = meta->bound[--meta->bindings];
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // extern "C"
