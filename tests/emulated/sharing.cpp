/* How the processes of one emulated machine share a GPU. Without MPS (a GPU's default), the
 * contexts of different processes do not run at once: the GPU gives itself to one context at a
 * time and switches after a time slice, preempting a kernel that is still running (compute
 * preemption). Here every block of a kernel waits for its process's turn on the device before
 * it starts and at each of its pauses and barriers; a process keeps the turn while it has
 * blocks running and nobody else waits, and another process takes it once the slice
 * (`STRAGGLAR_EMU_TIMESLICE_US`, 2000 by default; 0: every context runs at once, as before)
 * has run out, or at once when the holder has no block left. With `STRAGGLAR_EMU_MPS=1` (the
 * MPS daemon) there is no time slicing: the processes' kernels run at once and share the
 * device's multiprocessors instead, each block holding one of the machine's, whichever process
 * it belongs to.
 *
 * The machine is named by `STRAGGLAR_EMU_MACHINE` (scripts/emulated-gpu.sh sets one per run, so
 * that tests running side by side do not share GPUs); each of its devices has a record in
 * `/dev/shm/stragglar-emu-devices-<uid>`, found by hashing the name and the device, and
 * reclaimed when nobody touched it for ten minutes. */
#include "emu.h"
#include "kernel_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace emu {

namespace {

/* One device of one machine, in memory every process of the user maps. */
struct DeviceShare {
  /* The record's key (a hash of the machine and the device), kClaiming while a process resets
   * it, 0 when free. */
  uint64_t key;
  /* Whose turn it is: the holder's pid in the high half, when it took the turn in the low half
   * (in 10-us ticks, modulo 2^32); 0 when nobody holds it. */
  uint64_t turn;
  /* When a process last used the record (ns of CLOCK_MONOTONIC). */
  uint64_t touched_ns;
  /* Under MPS: multiprocessors held by blocks of every process. */
  int32_t mps_taken;
  int32_t unused;
};
static_assert(sizeof(DeviceShare) == 32, "a device's record is 32 bytes");
constexpr size_t kShares = 1024;
constexpr uint64_t kClaiming = 1;
constexpr uint64_t kStaleNs = 600ull * 1000000000ull;

uint64_t clock_ns() { return history_clock(); }
uint32_t ticks(uint64_t ns) { return (uint32_t)(ns / 10000); }

struct Settings {
  uint32_t slice_ticks = 200; /* 0: no time slicing */
  bool mps = false;
  bool report = false;
  std::string machine;
};

const Settings& settings() {
  static const Settings s = [] {
    Settings out;
    if (const char* v = getenv("STRAGGLAR_EMU_TIMESLICE_US")) out.slice_ticks = (uint32_t)(atol(v) / 10);
    if (const char* v = getenv("STRAGGLAR_EMU_MPS")) out.mps = strcmp(v, "1") == 0;
    if (const char* v = getenv("STRAGGLAR_EMU_SHARING_REPORT")) out.report = strcmp(v, "1") == 0;
    const char* m = getenv("STRAGGLAR_EMU_MACHINE");
    out.machine = m && *m ? m : "default";
    return out;
  }();
  return s;
}

/* FNV-1a over the machine's name and the device. */
uint64_t key_of(int device) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : settings().machine) h = (h ^ c) * 1099511628211ull;
  h = (h ^ (uint64_t)(uint32_t)device) * 1099511628211ull;
  return h < 2 ? h + 2 : h;
}

DeviceShare* shares() {
  static DeviceShare* mapped = [] {
    const std::string path = "/dev/shm/stragglar-emu-devices-" + std::to_string(getuid());
    const size_t bytes = kShares * sizeof(DeviceShare);
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
      fprintf(stderr, "emulated GPU: cannot open %s: GPUs are not shared between processes\n",
              path.c_str());
      if (fd >= 0) close(fd);
      return (DeviceShare*)nullptr;
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? (DeviceShare*)nullptr : (DeviceShare*)p;
  }();
  return mapped;
}

/* This process's record of `device` (null when the records cannot be mapped). */
DeviceShare* share_of(int device) {
  static std::mutex m;
  static std::map<int, DeviceShare*> found;
  std::lock_guard<std::mutex> g(m);
  auto it = found.find(device);
  if (it != found.end()) return it->second;
  DeviceShare* all = shares();
  if (!all) return nullptr;
  const uint64_t key = key_of(device);
  for (;;) {
    for (size_t i = 0; i < kShares; ++i) {
      DeviceShare* s = &all[(key + i) % kShares];
      uint64_t k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
      if (k == key) return found[device] = s;
      if (k == kClaiming) break; /* being reset: look again */
      const bool stale =
          k != 0 && clock_ns() - __atomic_load_n(&s->touched_ns, __ATOMIC_RELAXED) > kStaleNs;
      if (k != 0 && !stale) continue;
      if (!__atomic_compare_exchange_n(&s->key, &k, kClaiming, false, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE))
        break;
      __atomic_store_n(&s->turn, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&s->mps_taken, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&s->touched_ns, clock_ns(), __ATOMIC_RELAXED);
      __atomic_store_n(&s->key, key, __ATOMIC_RELEASE);
      return found[device] = s;
    }
    struct timespec t = {0, 50000};
    nanosleep(&t, nullptr);
  }
}

/* Per device: this process's running blocks, and how often it took the turn from another
 * process. */
struct Local {
  std::atomic<int> running{0};
  std::atomic<uint64_t> taken{0};
};
Local* local_of(int device) {
  static std::mutex m;
  static std::map<int, Local*>* all = new std::map<int, Local*>();
  std::lock_guard<std::mutex> g(m);
  Local*& l = (*all)[device];
  if (!l) {
    l = new Local();
    if (settings().report) {
      static std::once_flag once;
      std::call_once(once, [] {
        atexit([] {
          for (auto& kv : *all)
            fprintf(stderr, "emulated GPU %d: process %d took its turn from another %llu times\n",
                    kv.first, (int)getpid(), (unsigned long long)kv.second->taken.load());
        });
      });
    }
  }
  return l;
}

bool time_sliced() { return settings().slice_ticks > 0 && !settings().mps; }

void nap() {
  struct timespec t = {0, 50000};
  nanosleep(&t, nullptr);
}
}  // namespace

void wait_for_turn(int device) {
  if (!time_sliced()) return;
  /* Called at every pause of every block: the block's thread keeps its device's record and
   * its pid (a block runs on one device, in one process). */
  thread_local int cached_device = -1;
  thread_local DeviceShare* cached_share = nullptr;
  thread_local uint64_t me = 0;
  if (cached_device != device) {
    cached_share = share_of(device);
    cached_device = device;
    me = (uint64_t)(uint32_t)getpid();
  }
  DeviceShare* s = cached_share;
  if (!s) return;
  for (;;) {
    uint64_t turn = __atomic_load_n(&s->turn, __ATOMIC_ACQUIRE);
    if (turn >> 32 == me) return;
    const uint64_t now = clock_ns();
    const bool over = turn == 0 || (uint32_t)(ticks(now) - (uint32_t)turn) >= settings().slice_ticks;
    if (over && __atomic_compare_exchange_n(&s->turn, &turn, me << 32 | ticks(now), false,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      __atomic_store_n(&s->touched_ns, now, __ATOMIC_RELAXED);
      if (turn != 0) local_of(device)->taken++;
      return;
    }
    nap();
  }
}

void block_started(int device) {
  if (time_sliced()) local_of(device)->running++;
  wait_for_turn(device);
}

void block_ended(int device) {
  if (!time_sliced()) return;
  if (--local_of(device)->running > 0) return;
  DeviceShare* s = share_of(device);
  if (!s) return;
  uint64_t turn = __atomic_load_n(&s->turn, __ATOMIC_ACQUIRE);
  if (turn >> 32 == (uint64_t)(uint32_t)getpid())
    __atomic_compare_exchange_n(&s->turn, &turn, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

bool mps_shares_multiprocessors() { return settings().mps; }

void mps_take_multiprocessor(int device) {
  DeviceShare* s = share_of(device);
  if (!s) return;
  for (;;) {
    int32_t taken = __atomic_load_n(&s->mps_taken, __ATOMIC_ACQUIRE);
    if (taken < machine().sms &&
        __atomic_compare_exchange_n(&s->mps_taken, &taken, taken + 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      __atomic_store_n(&s->touched_ns, clock_ns(), __ATOMIC_RELAXED);
      return;
    }
    nap();
  }
}

void mps_give_multiprocessors(int device, int count) {
  if (DeviceShare* s = share_of(device)) __atomic_fetch_sub(&s->mps_taken, count, __ATOMIC_ACQ_REL);
}

}  // namespace emu
