/* Device memory, host-mapped memory, IPC handles, copies and sets. A device allocation is a
 * memfd mapped shared, so another process opens its IPC handle through /proc/<pid>/fd/<fd> and
 * maps the same pages at an address of its own, as a GPU maps a peer's memory. Device pointers
 * are host addresses; every device-side range a call names must lie inside memory the
 * emulated GPUs can address, or the call fails with CUDA_ERROR_INVALID_VALUE.
 *
 * Scopes: behind each device allocation's bytes, in the same memfd (so every process mapping
 * it shares them), lies its shadow: a 32-bit word per 4 bytes saying which devices made a
 * strong access to them (bit d, for device d modulo 16) and which of those did at a scope
 * narrower than .sys (bit 16 + d). A kernel's narrow access to a word another device touches
 * too, to another device's memory or to host memory ends the process naming the word
 * (check_strong_access). Behind the shadow, a page lists the processes that map the allocation
 * through IPC: its exporter's cuMemFree while one of them still runs ends the process too.
 * Behind that page lies the allocation's history (stale loads, weak_memory.h): per 16 bytes,
 * when the last kernel store to them (plain, strong or atomic) was made, which of them it
 * wrote and what they held before, and the latest release made to a word among them; behind
 * the history, their store order (the coherence check, weak_memory.h): the vector clock the
 * releases to them published and, per 4-byte word, who made its last release store and when. */
#include "emu.h"
#include "kernel_source.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

namespace emu {

namespace {
enum class Kind { Device, Host, Registered, Ipc, Mapped };
struct Region {
  size_t bytes = 0;
  Kind kind = Kind::Device;
  int device = 0;
  int fd = -1;       /* Device: the memfd behind it */
  uint64_t ino = 0;  /* Device: its inode, so a reused fd number is told apart */
  int opened = 0;    /* Ipc: open count in the context that opened it */
  int64_t pid = 0;   /* Ipc: the exporter */
  /* Ipc: the device whose context opened the mapping: a handle opened in the contexts of two
   * devices is mapped twice, and only that device's kernels may use each mapping. */
  int opened_in = -1;
  /* Device and Ipc: the shadow (after `bytes` in the mapping, which is twice as long);
   * Mapped: the shadow's own mapping. */
  uint32_t* shadow = nullptr;
  /* Device, Ipc and Mapped: the history of each 16 bytes. */
  struct History* history = nullptr;
  /* Device and Ipc: the order of the strong stores to each 16 bytes (null for Mapped). */
  struct StoreOrder* order = nullptr;
};
std::mutex* g_mem = new std::mutex();
std::map<uint64_t, Region>* g_regions = new std::map<uint64_t, Region>();
/* Bumped under g_mem whenever a region comes or goes: what a thread's cached lookup checks. */
std::atomic<uint64_t> g_layout{1};

/* Under g_mem: records `reg` at `p`, or forgets the region `it`. */
void add_region(uint64_t p, const Region& reg) {
  (*g_regions)[p] = reg;
  g_layout.fetch_add(1, std::memory_order_release);
}
void remove_region(std::map<uint64_t, Region>::iterator it) {
  g_regions->erase(it);
  g_layout.fetch_add(1, std::memory_order_release);
}

/* What kernel stores and releases did to 16 bytes of device memory, for loads that may
 * return an older value (weak_memory.h). Shared by every process mapping the allocation. */
struct History {
  /* The holder's pid while the bytes and this record change together (0: free): a spin lock,
   * held for a copy of at most 16 bytes (HistoryLock). */
  uint32_t lock;
  /* The bytes (bit i: byte i) the last store written into them wrote. */
  uint16_t written;
  /* 1: that store was a multimem store, landed through a multicast address: a thread's load
   * sees it only once a fence.proxy.alias ordered the load after it (its alias view). */
  uint16_t proxy;
  /* When that store was made (kHistoryClock ns), and the latest view a release to a word
   * among these bytes published. */
  uint64_t stored_at;
  uint64_t released;
  /* What the written bytes held before that store. */
  unsigned char before[16];
};
static_assert(sizeof(History) == 40, "a history record is 40 bytes");
constexpr size_t kGranule = 16;

/* The order of the release stores to 16 bytes of device memory, for the coherence check
 * (weak_memory.h): what the releases to them published, and who stored each 4-byte word
 * last. Guarded by the granule's History lock. Only the records of words a kernel releases
 * to or acquires are ever touched, so the pages behind the data stay unallocated. */
struct StoreOrder {
  /* The latest vector clock a release to a word among these bytes published (per agent: ns of
   * the history clock; 0: nothing). */
  uint64_t published[kOrderAgents];
  /* Per 4-byte word: when its last release store was made, and by which agent (plus 1; 0:
   * none yet). */
  uint64_t stored_at[4];
  uint8_t stored_by[4];
  uint32_t unused;
};
static_assert(sizeof(StoreOrder) == 8 * kOrderAgents + 40, "a store-order record's size");

/* The bytes of a device allocation's history (its bytes are a multiple of a page). */
size_t history_bytes(size_t bytes) { return bytes / kGranule * sizeof(History); }
/* The bytes of its store-order records. */
size_t order_bytes(size_t bytes) { return bytes / kGranule * sizeof(StoreOrder); }

/* The length of a device allocation's mapping: its bytes, its shadow, one page of importers
 * (Importers), its history, then its store-order records. */
size_t mapped_bytes(size_t bytes) {
  return 2 * bytes + (size_t)sysconf(_SC_PAGESIZE) + history_bytes(bytes) + order_bytes(bytes);
}
History* history_of(void* base, size_t bytes) {
  return (History*)((char*)base + 2 * bytes + (size_t)sysconf(_SC_PAGESIZE));
}
StoreOrder* order_of(void* base, size_t bytes) {
  return (StoreOrder*)((char*)history_of(base, bytes) + history_bytes(bytes));
}

/* The processes that map a device allocation through IPC (a slot each, 0 when free), in the
 * page behind its shadow, so that the exporter sees them: freeing exported memory before its
 * importers closed it is undefined behaviour on a GPU (cuIpcOpenMemHandle's documentation),
 * silently harmless here but for this record. */
constexpr int kImporterSlots = 64;
int64_t* importers_of(void* base, size_t bytes) { return (int64_t*)((char*)base + 2 * bytes); }

/* Whether process `pid` is running (a zombie's mappings are gone). */
bool running(int64_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  FILE* f = fopen(path, "r");
  if (!f) return false;
  char line[512] = "";
  const bool read = fgets(line, sizeof line, f) != nullptr;
  fclose(f);
  const char* end = read ? strrchr(line, ')') : nullptr;
  return end && end[1] == ' ' && end[2] != 'Z' && end[2] != 'X';
}

/* The bytes filled into fresh device allocations up to this size (cuMemAlloc does not zero). */
constexpr size_t kPoisonLimit = size_t(64) << 20;

/* Under g_mem: the region holding p, or end(). */
std::map<uint64_t, Region>::iterator containing(uint64_t p) {
  auto it = g_regions->upper_bound(p);
  if (it == g_regions->begin()) return g_regions->end();
  --it;
  if (p >= it->first + it->second.bytes) return g_regions->end();
  return it;
}

size_t round_to_page(size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (n + page - 1) / page * page;
}

struct IpcHandle {
  uint32_t magic;
  uint32_t version;
  int64_t pid;
  int32_t fd;
  int32_t device;
  uint64_t ino;
  uint64_t bytes;
};
constexpr uint32_t kIpcMagic = 0x4d454753; /* "SGEM" */
static_assert(sizeof(IpcHandle) <= CU_IPC_HANDLE_SIZE, "an IPC handle is 64 bytes");

CUresult forbid_in_capture() {
  std::lock_guard<std::mutex> g(capture_lock());
  return unsafe_call_forbidden() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}
}  // namespace

bool pinned(const void* p) {
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = containing((uint64_t)p);
  return it != g_regions->end() &&
         (it->second.kind == Kind::Host || it->second.kind == Kind::Registered);
}

void add_mapped_memory(uint64_t p, size_t bytes, int device, uint32_t* shadow,
                       void* history) {
  Region reg;
  reg.bytes = bytes;
  reg.kind = Kind::Mapped;
  reg.device = device;
  reg.shadow = shadow;
  reg.history = (History*)history;
  std::lock_guard<std::mutex> g(*g_mem);
  add_region(p, reg);
}

void remove_mapped_memory(uint64_t p) {
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = g_regions->find(p);
  if (it != g_regions->end() && it->second.kind == Kind::Mapped) remove_region(it);
}

bool addressable(uint64_t p, size_t bytes) {
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = containing(p);
  return it != g_regions->end() && p + bytes <= it->first + it->second.bytes;
}

namespace {
/* One of a kernel thread's last lookups (check_strong_access, the history), valid while
 * g_layout is unchanged. A wait touches a few regions in turn (its flag in the staging, the
 * abort and failure words in host memory), a combine up to 8 ranks' staging and its output,
 * so a thread keeps several, replaced in turn. */
struct Seen {
  uint64_t layout = 0, base = 0, end = 0;
  Region region;
};
constexpr int kSeen = 8;
thread_local Seen t_seen[kSeen];
thread_local int t_next_seen = 0;

const char* scope_name(int scope) {
  return scope == 0 ? ".cta" : scope == 1 ? ".gpu" : ".sys";
}

/* What memory `seen` is, for a report: "<kind> device N" follows. */
const char* kind_of(const Seen& seen) {
  return seen.region.kind == Kind::Host         ? "host memory (cuMemHostAlloc) mapped by"
         : seen.region.kind == Kind::Registered ? "host memory (cuMemHostRegister) mapped by"
         : seen.region.kind == Kind::Ipc        ? "device memory, opened through IPC, of"
         : seen.region.kind == Kind::Mapped
             ? "device memory (cuMemCreate), mapped at cuMemMap, of"
             : "device memory of";
}

[[noreturn]] void scope_violation(const char* op, int scope, const char* file, int line,
                                  int device, uint64_t at, const Seen& seen, uint32_t shadow) {
  const char* kind = kind_of(seen);
  char touched[96] = "";
  if (shadow)
    snprintf(touched, sizeof touched, ", which devices 0x%x access (0x%x narrower than .sys)",
             shadow & 0xffff, shadow >> 16);
  /* One write, so that the other processes' logs on the same stderr never split the line. */
  char text[768];
  const int n = snprintf(text, sizeof text,
                         "emulated GPU: scope violation: %s at %s:%d, a %s-scope access by "
                         "device %d, to the word at offset 0x%llx of %zu bytes of %s device "
                         "%d%s: a word two GPUs, or a GPU and the host, share needs .sys scope\n",
                         op, file, line, scope_name(scope), device,
                         (unsigned long long)(at - seen.base), seen.region.bytes, kind,
                         seen.region.device, touched);
  if (n > 0) (void)!write(2, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
  abort();
}

/* A kernel of `device` touching an IPC mapping that another device's context opened: that
 * mapping is in the other GPU's address space, not this one's (an illegal address on a GPU).
 * Ends the process, naming the access. */
[[noreturn]] void unmapped_ipc_access(const char* op, const char* file, int line, int device,
                                      uint64_t at, const Seen& seen) {
  char text[512];
  const int n = snprintf(text, sizeof text,
                         "emulated GPU: %s at %s:%d by a kernel of device %d, at offset 0x%llx "
                         "of an IPC mapping that device %d's context opened: each context maps "
                         "the handle for its own device, so it must be opened on device %d\n",
                         op, file, line, device, (unsigned long long)(at - seen.base),
                         seen.region.opened_in, device);
  if (n > 0) (void)!write(2, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
  abort();
}
}  // namespace

namespace {
/* The region holding `bytes` at `at`, through the thread's last lookups; null for block-local
 * memory (shared memory, a thread's stack), which only its block reaches. */
const Seen* lookup(uint64_t at, uint32_t bytes) {
  const uint64_t layout = g_layout.load(std::memory_order_acquire);
  Seen* found = nullptr;
  for (Seen& s : t_seen)
    if (s.layout == layout && at >= s.base && at + bytes <= s.end) found = &s;
  if (!found) {
    found = &t_seen[t_next_seen];
    t_next_seen = (t_next_seen + 1) % kSeen;
  }
  Seen& seen = *found;
  if (seen.layout != layout || at < seen.base || at + bytes > seen.end) {
    std::lock_guard<std::mutex> g(*g_mem);
    seen.layout = g_layout.load(std::memory_order_relaxed);
    auto it = containing(at);
    if (it == g_regions->end()) {
      seen.base = seen.end = 0;
      return nullptr;
    }
    seen.base = it->first;
    seen.end = it->first + it->second.bytes;
    seen.region = it->second;
  }
  return &seen;
}
}  // namespace

uint32_t loaded_by(const void* p, uint32_t value, int device) {
  static const bool wrong = [] {
    const char* v = getenv("STRAGGLAR_EMU_PEER_LOADS");
    return v && strcmp(v, "wrong") == 0;
  }();
  if (!wrong) return value;
  const Seen* seen = lookup((uint64_t)p, 4);
  const bool peer = seen && seen->region.shadow && seen->region.device != device;
  return peer ? ~value : value;
}

void check_strong_access(const void* p, uint32_t bytes, int scope, const char* op,
                         const char* file, int line, int device) {
  const uint64_t at = (uint64_t)p;
  const Seen* lookedup = lookup(at, bytes);
  if (!lookedup) return;
  const Seen& seen = *lookedup;
  if (seen.region.kind == Kind::Ipc && seen.region.opened_in != device)
    unmapped_ipc_access(op, file, line, device, at, seen);
  const bool narrow = scope != 2;
  /* Host memory, and another GPU's memory, are never this GPU's alone. */
  const bool foreign = !seen.region.shadow || seen.region.device != device;
  if (narrow && foreign) scope_violation(op, scope, file, line, device, at, seen, 0);
  if (!seen.region.shadow) return;
  const uint32_t mine = 1u << (device % 16);
  const uint32_t marks = mine | (narrow ? mine << 16 : 0);
  const uint64_t last = (at + bytes - 1 - seen.base) / 4;
  for (uint64_t w = (at - seen.base) / 4; w <= last; ++w) {
    const uint32_t now = __atomic_fetch_or(&seen.region.shadow[w], marks, __ATOMIC_RELAXED) | marks;
    if ((now >> 16) != 0 && __builtin_popcount(now & 0xffff) > 1)
      scope_violation(op, scope, file, line, device, seen.base + 4 * w, seen, now);
  }
}

namespace {
/* The history of the 16 bytes holding `at`, or null when `at` is no device memory with a
 * history (host memory, memory from cuMemCreate, a thread's own). */
History* history_at(uint64_t at) {
  const Seen* seen = lookup(at, 1);
  if (!seen || !seen->region.history) return nullptr;
  return &seen->region.history[(at - seen->base) / kGranule];
}

/* Holds a history record and its bytes still; never held across a fiber switch. The lock word
 * holds the holder's pid: a process that ended holding it (a kernel's report aborts its
 * process, whose other blocks may hold one) leaves it to be taken over, so that its peers reach
 * their deadlines rather than spin here for ever. */
class HistoryLock {
 public:
  explicit HistoryLock(History* h) : h_(h) {
    static const uint32_t me = (uint32_t)getpid();
    for (uint32_t spins = 1;; ++spins) {
      uint32_t holder = 0;
      if (__atomic_compare_exchange_n(&h_->lock, &holder, me, false, __ATOMIC_ACQUIRE,
                                      __ATOMIC_RELAXED))
        return;
      if (spins % 4096 == 0 && holder != me && !running(holder) &&
          __atomic_compare_exchange_n(&h_->lock, &holder, me, false, __ATOMIC_ACQUIRE,
                                      __ATOMIC_RELAXED))
        return;
      sched_yield();
    }
  }
  ~HistoryLock() { __atomic_store_n(&h_->lock, 0u, __ATOMIC_RELEASE); }
  HistoryLock(const HistoryLock&) = delete;
  HistoryLock& operator=(const HistoryLock&) = delete;

 private:
  History* h_;
};

/* Calls `each(at, bytes, history)` for the pieces of [at, at + n) that lie in one 16-byte
 * granule each (history null outside device memory). */
template <class Each>
void by_granule(uint64_t at, uint32_t n, Each each) {
  while (n > 0) {
    const uint32_t room = (uint32_t)(kGranule - at % kGranule);
    const uint32_t piece = n < room ? n : room;
    each(at, piece, history_at(at));
    at += piece;
    n -= piece;
  }
}
}  // namespace

uint64_t history_clock() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

namespace {
/* Records into the history `h` (held) a store of `n` bytes at `at`, byte `first` of its 16,
 * made at `stored_at` (through the multicast proxy with `proxy`), before it lands: what those
 * bytes hold now is what they held before it. The record keeps one store, the last to land:
 * an older one's bytes pass for fresh (a load may always return the newest value). */
void record_store(History* h, uint32_t first, const void* at, uint32_t n, uint64_t stored_at,
                  bool proxy) {
  memcpy(h->before + first, at, n);
  h->written = (uint16_t)(((1u << n) - 1) << first);
  h->proxy = proxy ? 1 : 0;
  h->stored_at = stored_at;
}
}  // namespace

void land_store(void* at, const void* src, uint32_t n, uint64_t stored_at) {
  const unsigned char* from = (const unsigned char*)src;
  by_granule((uint64_t)at, n, [&](uint64_t p, uint32_t bytes, History* h) {
    if (!h) {
      memcpy((void*)p, from, bytes);
    } else {
      HistoryLock held(h);
      record_store(h, (uint32_t)(p % kGranule), (const void*)p, bytes, stored_at, false);
      memcpy((void*)p, from, bytes);
    }
    from += bytes;
  });
}

size_t history_bytes_of(size_t bytes) { return history_bytes(bytes); }

namespace {
/* A write of `n` bytes at `dst` by the host or a copy engine (a copy or a set), `fill(to,
 * offset, bytes)` writing the `bytes` at `to`, which lie `offset` bytes into it. Where they are
 * device memory with a history, each 16 bytes' record is replaced, under its lock, by this
 * write, made when it began, as a kernel's store is: a kernel thread that nothing ordered
 * after the write (its view predates it) may still read what the bytes held before, as on a
 * GPU, where a copy on another stream, or another GPU's, is seen late unless an event or a
 * flag orders it. An acquire that reads bytes it wrote is taken to publish what came before
 * the write (the stream's earlier work, and more: coarser, never finer). Elsewhere (host
 * memory, memory from cuMemCreate) it just writes. */
template <class Fill>
void copy_engine_write(void* dst, size_t n, const Fill& fill) {
  uint64_t at = (uint64_t)dst;
  size_t done = 0;
  const uint64_t now = history_clock();
  while (done < n) {
    const Seen* seen = lookup(at, 1);
    if (!seen) {
      fill((void*)at, done, n - done);
      return;
    }
    const size_t in_region = (size_t)(seen->end - at);
    const size_t piece = n - done < in_region ? n - done : in_region;
    if (!seen->region.history) {
      fill((void*)at, done, piece);
      at += piece;
      done += piece;
      continue;
    }
    for (size_t k = 0; k < piece;) {
      const uint32_t first = (uint32_t)((at + k - seen->base) % kGranule);
      const size_t room = kGranule - first;
      const uint32_t bytes = (uint32_t)(piece - k < room ? piece - k : room);
      History* h = &seen->region.history[(at + k - seen->base) / kGranule];
      HistoryLock held(h);
      record_store(h, first, (const void*)(at + k), bytes, now, false);
      if (now > h->released) h->released = now;
      fill((void*)(at + k), done + k, bytes);
      k += bytes;
    }
    at += piece;
    done += piece;
  }
}

/* copy_engine_write of a copy of `n` bytes from `src` (which may overlap `dst`, as memmove). */
void copy_engine_copy(void* dst, const void* src, size_t n) {
  const char* from = (const char*)src;
  std::vector<char> staged;
  const bool overlap = from < (const char*)dst + n && (const char*)dst < from + n;
  if (overlap) {
    staged.assign(from, from + n);
    from = staged.data();
  }
  copy_engine_write(dst, n, [from](void* to, size_t offset, size_t bytes) {
    memcpy(to, from + offset, bytes);
  });
}
}  // namespace


void land_multimem(unsigned char* at, const void* src, uint32_t n, uint64_t stored_at,
                   const unsigned char* base, void* history) {
  const unsigned char* from = (const unsigned char*)src;
  while (n > 0) {
    const size_t offset = (size_t)(at - base);
    const uint32_t first = (uint32_t)(offset % kGranule);
    const uint32_t room = (uint32_t)kGranule - first;
    const uint32_t bytes = n < room ? n : room;
    History* h = (History*)history + offset / kGranule;
    HistoryLock held(h);
    record_store(h, first, at, bytes, stored_at, true);
    /* Word by word, as the switch writes them: a concurrent reader sees whole words. */
    for (uint32_t k = 0; k < bytes; k += 4) {
      uint32_t word;
      memcpy(&word, from + k, 4);
      __atomic_store_n((uint32_t*)(at + k), word, __ATOMIC_RELAXED);
    }
    at += bytes;
    from += bytes;
    n -= bytes;
  }
}

void load_as_of(void* dst, const void* src, uint32_t n, uint64_t view, uint64_t alias_view) {
  unsigned char* to = (unsigned char*)dst;
  by_granule((uint64_t)src, n, [&](uint64_t p, uint32_t bytes, History* h) {
    if (!h) {
      memcpy(to, (const void*)p, bytes);
    } else {
      const uint32_t first = (uint32_t)(p % kGranule);
      HistoryLock held(h);
      memcpy(to, (const void*)p, bytes);
      if (h->stored_at > (h->proxy ? alias_view : view)) {
        for (uint32_t i = 0; i < bytes; ++i)
          if (h->written & (1u << (first + i))) to[i] = h->before[first + i];
      }
    }
    to += bytes;
  });
}

void note_release(const void* word, uint64_t view) {
  History* h = history_at((uint64_t)word);
  if (!h) return;
  HistoryLock held(h);
  if (view > h->released) h->released = view;
}

uint64_t released_view(const void* word) {
  History* h = history_at((uint64_t)word);
  /* A word with no history (host memory) is taken to publish everything so far. */
  if (!h) return history_clock();
  HistoryLock held(h);
  return h->released;
}

namespace {
/* A strong word of `n` bytes (4 or 8) at `at`, read or written atomically. */
uint64_t load_word(const void* at, uint32_t n) {
  if (n == 8) return __atomic_load_n((const uint64_t*)at, __ATOMIC_ACQUIRE);
  return __atomic_load_n((const uint32_t*)at, __ATOMIC_ACQUIRE);
}
void store_word(void* at, uint64_t v, uint32_t n) {
  if (n == 8)
    __atomic_store_n((uint64_t*)at, v, __ATOMIC_RELEASE);
  else
    __atomic_store_n((uint32_t*)at, (uint32_t)v, __ATOMIC_RELEASE);
}
/* Makes the strong write `write` to the `n`-byte word at `at`, recorded as its granule's last
 * store where it has a history; returns when it was made (0: not recorded). */
template <class Write>
uint64_t recorded(void* at, uint32_t n, Write write) {
  History* h = history_at((uint64_t)at);
  if (!h) {
    write();
    return 0;
  }
  HistoryLock held(h);
  const uint64_t now = history_clock();
  record_store(h, (uint32_t)((uint64_t)at % kGranule), at, n, now, false);
  write();
  return now;
}
}  // namespace

uint64_t strong_store(void* at, const void* src, uint32_t n) {
  uint64_t v = 0;
  memcpy(&v, src, n);
  return recorded(at, n, [&] { store_word(at, v, n); });
}

uint64_t strong_add(void* at, uint64_t v, uint32_t n, uint64_t* old) {
  return recorded(at, n, [&] {
    if (n == 8)
      *old = __atomic_fetch_add((uint64_t*)at, v, __ATOMIC_ACQ_REL);
    else
      *old = __atomic_fetch_add((uint32_t*)at, (uint32_t)v, __ATOMIC_ACQ_REL);
  });
}

StrongRead strong_read(const void* at, uint32_t n) {
  StrongRead read{};
  History* h = history_at((uint64_t)at);
  if (!h) {
    read.current = read.older = load_word(at, n);
    read.read_at = history_clock();
    return read;
  }
  HistoryLock held(h);
  read.current = load_word(at, n);
  read.read_at = history_clock();
  unsigned char older[8];
  memcpy(older, &read.current, n);
  const uint32_t first = (uint32_t)((uint64_t)at % kGranule);
  bool written = false;
  for (uint32_t i = 0; i < n; ++i) {
    if (h->written & (1u << (first + i))) {
      older[i] = h->before[first + i];
      written = true;
    }
  }
  memcpy(&read.older, older, n);
  if (written) {
    read.stored_at = h->stored_at;
    read.proxy = h->proxy != 0;
  }
  return read;
}

namespace {
/* The history and store-order records of the 16 bytes holding `at`, and its region; both
 * records null where `at` has no store order (host memory, memory from cuMemCreate). */
struct Ordered {
  History* history;
  StoreOrder* order;
  const Seen* seen;
};
Ordered ordered_at(uint64_t at) {
  const Seen* seen = lookup(at, 1);
  if (!seen || !seen->region.order || !seen->region.history) return {nullptr, nullptr, seen};
  const uint64_t granule = (at - seen->base) / kGranule;
  return {&seen->region.history[granule], &seen->region.order[granule], seen};
}

/* Two release stores to one word that no chain of releases and acquires orders: ends the
 * process, naming the word and both stores. */
[[noreturn]] void unordered_stores(const char* op, const char* file, int line, int device,
                                   uint64_t at, const Seen& seen, uint32_t earlier_agent,
                                   uint64_t earlier_at, uint64_t now) {
  char text[768];
  const int n = snprintf(
      text, sizeof text,
      "emulated GPU: unordered stores: %s at %s:%d by device %d, to the word at offset 0x%llx "
      "of %zu bytes of %s device %d: the release store device %u (mod %u) made to it %llu ns "
      "earlier is not ordered before this one by any chain of releases and acquires, so a GPU "
      "may let this one land first and leave the older value in the word\n",
      op, file, line, device, (unsigned long long)(at - seen.base), seen.region.bytes,
      kind_of(seen), seen.region.device, earlier_agent, kOrderAgents,
      (unsigned long long)(now > earlier_at ? now - earlier_at : 0));
  if (n > 0) (void)!write(2, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
  abort();
}
}  // namespace

void publish_order(const void* word, const uint64_t* clock) {
  const Ordered o = ordered_at((uint64_t)word);
  if (!o.order) return;
  HistoryLock held(o.history);
  for (uint32_t a = 0; a < kOrderAgents; ++a)
    if (clock[a] > o.order->published[a]) o.order->published[a] = clock[a];
}

void take_order(const void* word, uint64_t* clock) {
  const Ordered o = ordered_at((uint64_t)word);
  if (!o.order) {
    /* A word with no record (host memory) is taken to publish everything so far, as
     * released_view does. */
    const uint64_t now = history_clock();
    for (uint32_t a = 0; a < kOrderAgents; ++a)
      if (clock[a] < now) clock[a] = now;
    return;
  }
  HistoryLock held(o.history);
  for (uint32_t a = 0; a < kOrderAgents; ++a)
    if (o.order->published[a] > clock[a]) clock[a] = o.order->published[a];
}

void check_store_order(const void* word, uint32_t bytes, const uint64_t* clock, int device,
                       const char* op, const char* file, int line) {
  const uint64_t at = (uint64_t)word;
  const Ordered o = ordered_at(at);
  if (!o.order || bytes == 0) return;
  const uint32_t agent = (uint32_t)device % kOrderAgents;
  const uint32_t first = (uint32_t)(at % kGranule) / 4;
  const uint32_t last = (uint32_t)((at + bytes - 1) % kGranule) / 4;
  uint32_t earlier_agent = 0;
  uint64_t earlier_at = 0;
  bool unordered = false;
  {
    HistoryLock held(o.history);
    for (uint32_t w = first; w <= last && w < 4; ++w) {
      const uint8_t by = o.order->stored_by[w];
      if (by != 0 && by - 1u != agent && clock[by - 1] < o.order->stored_at[w]) {
        unordered = true;
        earlier_agent = by - 1u;
        earlier_at = o.order->stored_at[w];
      }
      o.order->stored_by[w] = (uint8_t)(agent + 1);
      o.order->stored_at[w] = clock[agent];
    }
  }
  /* Reported with the record's lock released: the peers may still take it while this
   * process ends. */
  if (unordered)
    unordered_stores(op, file, line, device, at, *o.seen, earlier_agent, earlier_at,
                     history_clock());
}

}  // namespace emu

using namespace emu;

/* Sets `count` values of T at `dst` to `value`, as a copy engine's write (copy_engine_write).
 * `dst` is aligned to T, so every 16 bytes' piece holds whole values. */
template <typename T>
static void fill(CUdeviceptr dst, T value, size_t count) {
  copy_engine_write((void*)dst, count * sizeof(T), [value](void* to, size_t, size_t bytes) {
    T* p = (T*)to;
    for (size_t i = 0; i < bytes / sizeof(T); ++i) p[i] = value;
  });
}

static CUresult context_for_memory(Context** c) {
  CUresult r = require_context(c);
  if (r != CUDA_SUCCESS) return r;
  return forbid_in_capture();
}

extern "C" {

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  EMU_FAULT("cuMemAlloc_v2");
  Context* c = nullptr;
  CUresult r = context_for_memory(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t size = round_to_page(bytes);
  int fd = memfd_create("stragglar-emulated-gpu", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st;
  if (ftruncate(fd, (off_t)mapped_bytes(size)) != 0 || fstat(fd, &st) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* p = mmap(nullptr, mapped_bytes(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (size <= kPoisonLimit) memset(p, 0xA5, size);
  Region reg;
  reg.bytes = size;
  reg.kind = Kind::Device;
  reg.device = c->device;
  reg.fd = fd;
  reg.ino = (uint64_t)st.st_ino;
  reg.shadow = (uint32_t*)((char*)p + size);
  reg.history = history_of(p, size);
  reg.order = order_of(p, size);
  {
    std::lock_guard<std::mutex> g(*g_mem);
    add_region((uint64_t)p, reg);
  }
  *dptr = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  EMU_FAULT("cuMemFree_v2");
  Context* c = nullptr;
  CUresult r = context_for_memory(&c);
  if (r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;
  {
    std::lock_guard<std::mutex> g(*g_mem);
    auto it = g_regions->find(dptr);
    if (it == g_regions->end() || it->second.kind != Kind::Device) return CUDA_ERROR_INVALID_VALUE;
  }
  /* As the real driver: the free waits for the context's queued work first (a kernel still
   * using the memory finishes; one that never does holds the free). */
  drain_context(c);
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = g_regions->find(dptr);
  if (it == g_regions->end() || it->second.kind != Kind::Device) return CUDA_ERROR_INVALID_VALUE;
  const int64_t* importers = importers_of((void*)dptr, it->second.bytes);
  for (int i = 0; i < kImporterSlots; ++i) {
    const int64_t pid = __atomic_load_n(&importers[i], __ATOMIC_ACQUIRE);
    if (pid == 0 || !running(pid)) continue;
    char text[256];
    const int n = snprintf(text, sizeof text,
                           "emulated GPU: cuMemFree of %zu bytes of device %d that process %lld "
                           "still maps through IPC (it never called cuIpcCloseMemHandle): "
                           "undefined behaviour on a GPU\n",
                           it->second.bytes, it->second.device, (long long)pid);
    if (n > 0) (void)!write(2, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
    abort();
  }
  munmap((void*)dptr, mapped_bytes(it->second.bytes));
  close(it->second.fd);
  remove_region(it);
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  EMU_FAULT("cuMemGetInfo_v2");
  Context* c = nullptr;
  CUresult r = require_context(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  size_t used = 0;
  {
    std::lock_guard<std::mutex> g(*g_mem);
    for (auto& kv : *g_regions)
      if (kv.second.kind == Kind::Device && kv.second.device == c->device) used += kv.second.bytes;
  }
  *total = machine().memory_bytes;
  *free_bytes = used < *total ? *total - used : 0;
  return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  EMU_FAULT("cuMemHostAlloc");
  (void)flags;
  Context* c = nullptr;
  CUresult r = context_for_memory(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!pp || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t size = round_to_page(bytes);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Region reg;
  reg.bytes = size;
  reg.kind = Kind::Host;
  reg.device = c->device;
  {
    std::lock_guard<std::mutex> g(*g_mem);
    add_region((uint64_t)p, reg);
  }
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void** pp, size_t bytes) {
  EMU_FAULT("cuMemAllocHost_v2");
  return cuMemHostAlloc(pp, bytes, 0);
}

CUresult cuMemFreeHost(void* p) {
  EMU_FAULT("cuMemFreeHost");
  Context* c = nullptr;
  CUresult r = context_for_memory(&c);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = g_regions->find((uint64_t)p);
  if (it == g_regions->end() || it->second.kind != Kind::Host) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.bytes);
  remove_region(it);
  return CUDA_SUCCESS;
}

/* Page-locks host memory the caller mapped (shared memory of several processes, say) and
 * makes it addressable by the GPUs at its own address, as with CU_MEMHOSTREGISTER_DEVICEMAP.
 * Page-aligned ranges only here (the real driver rounds). */
CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned int flags) {
  EMU_FAULT("cuMemHostRegister_v2");
  (void)flags;
  Context* c = nullptr;
  CUresult r = context_for_memory(&c);
  if (r != CUDA_SUCCESS) return r;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (!p || bytes == 0 || (uint64_t)p % page != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_mem);
  auto next = g_regions->lower_bound((uint64_t)p);
  if (containing((uint64_t)p) != g_regions->end() ||
      (next != g_regions->end() && next->first < (uint64_t)p + bytes))
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  Region reg;
  reg.bytes = round_to_page(bytes);
  reg.kind = Kind::Registered;
  reg.device = c->device;
  add_region((uint64_t)p, reg);
  return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void* p) {
  EMU_FAULT("cuMemHostUnregister");
  Context* c = nullptr;
  CUresult r = context_for_memory(&c);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = g_regions->find((uint64_t)p);
  if (it == g_regions->end() || it->second.kind != Kind::Registered)
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  remove_region(it);
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned int flags) {
  EMU_FAULT("cuMemHostGetDevicePointer_v2");
  EMU_REQUIRE_INIT();
  if (!dptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = containing((uint64_t)p);
  if (it == g_regions->end() || (it->second.kind != Kind::Host && it->second.kind != Kind::Registered))
    return CUDA_ERROR_INVALID_VALUE;
  *dptr = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  EMU_FAULT("cuIpcGetMemHandle");
  Context* c = nullptr;
  CUresult r = require_context(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = containing(dptr);
  if (it == g_regions->end() || it->second.kind != Kind::Device) return CUDA_ERROR_INVALID_VALUE;
  IpcHandle h;
  memset(&h, 0, sizeof h);
  h.magic = kIpcMagic;
  h.version = 1;
  h.pid = (int64_t)getpid();
  h.fd = it->second.fd;
  h.device = it->second.device;
  h.ino = it->second.ino;
  h.bytes = it->second.bytes;
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  EMU_FAULT("cuIpcOpenMemHandle_v2");
  (void)flags;
  Context* c = nullptr;
  CUresult r = context_for_memory(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  IpcHandle h;
  memcpy(&h, handle.reserved, sizeof h);
  if (h.magic != kIpcMagic || h.version != 1) return CUDA_ERROR_INVALID_VALUE;
  if (h.pid == (int64_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> g(*g_mem);
  for (auto& kv : *g_regions) {
    Region& reg = kv.second;
    if (reg.kind == Kind::Ipc && reg.pid == h.pid && reg.ino == h.ino &&
        reg.opened_in == c->device) {
      reg.opened++;
      *dptr = (CUdeviceptr)kv.first;
      return CUDA_SUCCESS;
    }
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%lld/fd/%d", (long long)h.pid, h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE; /* the exporter is gone, or freed it */
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != h.ino ||
      (uint64_t)st.st_size != mapped_bytes(h.bytes)) {
    close(fd);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  void* p = mmap(nullptr, mapped_bytes(h.bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Region reg;
  reg.bytes = h.bytes;
  reg.kind = Kind::Ipc;
  reg.device = h.device;
  reg.ino = h.ino;
  reg.pid = h.pid;
  reg.opened_in = c->device;
  reg.opened = 1;
  reg.shadow = (uint32_t*)((char*)p + h.bytes);
  reg.history = history_of(p, h.bytes);
  reg.order = order_of(p, h.bytes);
  int64_t* importers = importers_of(p, h.bytes);
  for (int i = 0; i < kImporterSlots; ++i) {
    int64_t free_slot = 0;
    if (__atomic_compare_exchange_n(&importers[i], &free_slot, (int64_t)getpid(), false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
      break;
  }
  add_region((uint64_t)p, reg);
  *dptr = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  EMU_FAULT("cuIpcCloseMemHandle");
  Context* c = nullptr;
  CUresult r = context_for_memory(&c);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(*g_mem);
  auto it = g_regions->find(dptr);
  if (it == g_regions->end() || it->second.kind != Kind::Ipc) return CUDA_ERROR_INVALID_VALUE;
  if (it->second.opened_in != c->device) return CUDA_ERROR_INVALID_CONTEXT;
  if (--it->second.opened == 0) {
    int64_t* importers = importers_of((void*)dptr, it->second.bytes);
    for (int i = 0; i < kImporterSlots; ++i) {
      int64_t mine = (int64_t)getpid();
      if (__atomic_compare_exchange_n(&importers[i], &mine, 0, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_RELAXED))
        break;
    }
    munmap((void*)dptr, mapped_bytes(it->second.bytes));
    remove_region(it);
  }
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ copies and sets ------ */

static CUresult async_on(CUstream hs, std::function<void()> run,
                         CUgraphNodeType type = CU_GRAPH_NODE_TYPE_MEMCPY) {
  std::lock_guard<std::mutex> g(capture_lock());
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  return submit(s, std::move(run), type);
}

#define EMU_DEVICE_RANGE(p, n) \
  if ((n) != 0 && !addressable((uint64_t)(p), (n))) return CUDA_ERROR_INVALID_VALUE

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  EMU_FAULT("cuMemcpyHtoD_v2");
  EMU_REQUIRE_INIT();
  EMU_DEVICE_RANGE(dst, n);
  return run_synchronously([=] { copy_engine_copy((void*)dst, src, n); });
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  EMU_FAULT("cuMemcpyDtoH_v2");
  EMU_REQUIRE_INIT();
  EMU_DEVICE_RANGE(src, n);
  return run_synchronously([=] { copy_engine_copy(dst, (const void*)src, n); });
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  EMU_FAULT("cuMemcpyDtoD_v2");
  EMU_REQUIRE_INIT();
  EMU_DEVICE_RANGE(dst, n);
  EMU_DEVICE_RANGE(src, n);
  return run_synchronously([=] { copy_engine_copy((void*)dst, (const void*)src, n); });
}

/* From pageable memory the source is staged before the call returns (the caller may reuse it
 * at once), as the real driver does; from pinned memory it is read when the copy runs. */
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream hs) {
  EMU_FAULT("cuMemcpyHtoDAsync_v2");
  EMU_REQUIRE_INIT();
  EMU_DEVICE_RANGE(dst, n);
  if (pinned(src)) return async_on(hs, [=] { copy_engine_copy((void*)dst, src, n); });
  auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + n);
  return async_on(hs, [=] { copy_engine_copy((void*)dst, staged->data(), n); });
}

/* Into pageable memory the call returns only once the copy is done, as the real driver does;
 * into pinned memory it is asynchronous. */
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream hs) {
  EMU_FAULT("cuMemcpyDtoHAsync_v2");
  EMU_REQUIRE_INIT();
  EMU_DEVICE_RANGE(src, n);
  if (pinned(dst)) return async_on(hs, [=] { copy_engine_copy(dst, (const void*)src, n); });
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> g(capture_lock());
    CUresult r = resolve_stream(hs, &s);
    if (r != CUDA_SUCCESS) return r;
    if (s->capture) return submit(s, [=] { copy_engine_copy(dst, (const void*)src, n); }, CU_GRAPH_NODE_TYPE_MEMCPY);
    r = submit(s, [=] { copy_engine_copy(dst, (const void*)src, n); }, CU_GRAPH_NODE_TYPE_MEMCPY);
    if (r != CUDA_SUCCESS) return r;
    seq = s->enqueued;
  }
  wait_for(s, seq);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs) {
  EMU_FAULT("cuMemcpyDtoDAsync_v2");
  EMU_REQUIRE_INIT();
  EMU_DEVICE_RANGE(dst, n);
  EMU_DEVICE_RANGE(src, n);
  return async_on(hs, [=] { copy_engine_copy((void*)dst, (const void*)src, n); });
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs) {
  EMU_FAULT("cuMemcpyAsync");
  EMU_REQUIRE_INIT();
  return async_on(hs, [=] { copy_engine_copy((void*)dst, (const void*)src, n); });
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  EMU_FAULT("cuMemcpy");
  EMU_REQUIRE_INIT();
  return run_synchronously([=] { copy_engine_copy((void*)dst, (const void*)src, n); });
}


CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t count) {
  EMU_FAULT("cuMemsetD8_v2");
  EMU_REQUIRE_INIT();
  EMU_DEVICE_RANGE(dst, count);
  return run_synchronously([=] { fill<unsigned char>(dst, v, count); });
}

CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t count) {
  EMU_FAULT("cuMemsetD32_v2");
  EMU_REQUIRE_INIT();
  if (dst % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  EMU_DEVICE_RANGE(dst, count * 4);
  return run_synchronously([=] { fill<uint32_t>(dst, v, count); });
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t count, CUstream hs) {
  EMU_FAULT("cuMemsetD8Async");
  EMU_REQUIRE_INIT();
  EMU_DEVICE_RANGE(dst, count);
  return async_on(hs, [=] { fill<unsigned char>(dst, v, count); }, CU_GRAPH_NODE_TYPE_MEMSET);
}

CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t count, CUstream hs) {
  EMU_FAULT("cuMemsetD16Async");
  EMU_REQUIRE_INIT();
  if (dst % 2 != 0) return CUDA_ERROR_INVALID_VALUE;
  EMU_DEVICE_RANGE(dst, count * 2);
  return async_on(hs, [=] { fill<uint16_t>(dst, v, count); }, CU_GRAPH_NODE_TYPE_MEMSET);
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t count, CUstream hs) {
  EMU_FAULT("cuMemsetD32Async");
  EMU_REQUIRE_INIT();
  if (dst % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  EMU_DEVICE_RANGE(dst, count * 4);
  return async_on(hs, [=] { fill<uint32_t>(dst, v, count); }, CU_GRAPH_NODE_TYPE_MEMSET);
}

}  // extern "C"
