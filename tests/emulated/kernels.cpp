/* Modules, functions and launches. cuModuleLoadData takes the CUBIN the engine made (or the
 * self-test's PTX), reads the kernel entry names in it, refuses it where it calls a function
 * the driver lacks, and binds each name to the host build of the same kernel source; a launch
 * runs every block on its own OS thread (its threads as fibers), each block first taking one of
 * the device's multiprocessors, so a grid that could not be resident on a real GPU waits here
 * as it would there. */
#include "emu.h"
#include "kernel_source.h"
#include "schedule.h"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <elf.h>
#include <map>
#include <string>

namespace emu {

struct Module {
  Context* ctx = nullptr;
  std::vector<const KernelSpec*> kernels;
};
struct Function {
  Module* module = nullptr;
  const KernelSpec* spec = nullptr;
};

namespace {
std::mutex* g_lock = new std::mutex();
std::set<Module*>* g_modules = new std::set<Module*>();
std::set<Function*>* g_functions = new std::set<Function*>();

/* Multiprocessors free on each device of this process (under MPS, sharing.cpp counts the
 * machine's instead). */
struct Sms {
  std::mutex m;
  std::condition_variable cv;
  int free = -1; /* set at first use */
};
std::map<int, Sms*>* g_sms = new std::map<int, Sms*>();

Sms* sms_of(int device) {
  std::lock_guard<std::mutex> g(*g_lock);
  Sms*& s = (*g_sms)[device];
  if (!s) {
    s = new Sms();
    s->free = machine().sms;
  }
  return s;
}

const KernelSpec* spec_named(const char* name) {
  size_t n = 0;
  const KernelSpec* specs = kernel_specs(&n);
  for (size_t i = 0; i < n; ++i)
    if (strcmp(specs[i].name, name) == 0) return &specs[i];
  return nullptr;
}

/* Whether this driver resolves a module's call to the external function `name`: the device
 * runtime's cudaGraphSetConditional from CUDA 12.3 on, and nothing else (a module that calls
 * anything more is refused whole, as a driver lacking one of its functions refuses it). */
bool resolves(const char* name) {
  return strcmp(name, "cudaGraphSetConditional") == 0 && machine().driver_version >= 12030;
}

/* The kernels an ELF CUBIN defines, or false if the image is not a well-formed ELF of the
 * emulated architecture (sm_90). */
bool cubin_kernels(const unsigned char* image, std::vector<const KernelSpec*>* out,
                   CUresult* error) {
  Elf64_Ehdr eh;
  memcpy(&eh, image, sizeof eh);
  *error = CUDA_ERROR_INVALID_IMAGE;
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr)) return false;
  if (eh.e_machine != 190 /* EM_CUDA */) return false;
  /* sm_XY: bits 0..7 of the flags up to ELF ABI version 7 (NVRTC 12.x), bits 8..15 after. */
  uint32_t arch = eh.e_ident[EI_ABIVERSION] <= 7 ? eh.e_flags & 0xff : (eh.e_flags >> 8) & 0xff;
  if (arch != 90) {
    *error = CUDA_ERROR_NO_BINARY_FOR_GPU;
    return false;
  }
  const Elf64_Shdr* sh = (const Elf64_Shdr*)(image + eh.e_shoff);
  for (uint16_t i = 0; i < eh.e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh.e_shnum) continue;
    const Elf64_Sym* syms = (const Elf64_Sym*)(image + sh[i].sh_offset);
    size_t count = sh[i].sh_size / sizeof(Elf64_Sym);
    const char* names = (const char*)(image + sh[sh[i].sh_link].sh_offset);
    for (size_t k = 0; k < count; ++k) {
      /* An undefined global symbol, whatever its type, is one the driver must resolve at load
       * (an undefined weak one, as NVRTC's `.nv.reservedSmem.offset0`, may stay unresolved). */
      if (syms[k].st_shndx == SHN_UNDEF && ELF64_ST_BIND(syms[k].st_info) == STB_GLOBAL) {
        if (resolves(names + syms[k].st_name)) continue;
        fprintf(stderr, "emulated GPU: cuModuleLoadData: the CUBIN calls %s, which this driver (CUDA %d.%d) lacks\n",
                names + syms[k].st_name, machine().driver_version / 1000,
                machine().driver_version % 1000 / 10);
        *error = CUDA_ERROR_NOT_FOUND;
        return false;
      }
      if (ELF64_ST_TYPE(syms[k].st_info) != STT_FUNC) continue;
      const KernelSpec* spec = spec_named(names + syms[k].st_name);
      if (spec) out->push_back(spec);
    }
  }
  return true;
}

/* The kernels a PTX text declares with `.entry`, or false where it calls an `.extern .func`
 * this driver does not resolve (see `resolves`). */
bool ptx_kernels(const char* text, std::vector<const KernelSpec*>* out) {
  const char* const external = ".extern .func ";
  for (const char* at = strstr(text, external); at; at = strstr(at + 1, external)) {
    std::string name;
    for (const char* c = at + strlen(external); *c && (isalnum((unsigned char)*c) || *c == '_'); ++c)
      name += *c;
    if (!resolves(name.c_str())) {
      fprintf(stderr, "emulated GPU: cuModuleLoadData: the PTX calls %s, which this driver (CUDA %d.%d) lacks\n",
              name.c_str(), machine().driver_version / 1000, machine().driver_version % 1000 / 10);
      return false;
    }
  }
  size_t n = 0;
  const KernelSpec* specs = kernel_specs(&n);
  for (size_t i = 0; i < n; ++i) {
    std::string entry = std::string(".entry ") + specs[i].name;
    if (strstr(text, entry.c_str())) out->push_back(&specs[i]);
  }
  return true;
}

/* Takes one of `device`'s multiprocessors, waiting while none is free: this process's, or,
 * under MPS, the machine's. */
void take_multiprocessor(Sms* sms, int device) {
  if (mps_shares_multiprocessors()) {
    mps_take_multiprocessor(device);
    return;
  }
  std::unique_lock<std::mutex> l(sms->m);
  sms->cv.wait(l, [&] { return sms->free > 0; });
  sms->free--;
}

void give_multiprocessors(Sms* sms, int device, int count) {
  if (mps_shares_multiprocessors()) {
    mps_give_multiprocessors(device, count);
    return;
  }
  {
    std::lock_guard<std::mutex> l(sms->m);
    sms->free += count;
  }
  sms->cv.notify_all();
}

void block_thread(const KernelSpec* spec, std::shared_ptr<std::vector<char>> params, uint32_t b,
                  uint32_t grid, uint32_t threads, Sms* sms, int device, uint64_t launch) {
  if (schedule_seed()) {
    Rng start = rng_for(kChoiceBlocks, launch, b + 1);
    random_sleep(start, 200);
  }
  block_started(device);
  run_block(spec, params->data(), b, grid, threads, device, launch);
  block_ended(device);
  give_multiprocessors(sms, device, 1);
}
}  // namespace

/* Runs launch number `launch` (of this process) of `spec`: its blocks in index order, or,
 * seeded, in a random order of each device's own (as the multiprocessors other work leaves
 * free differ from GPU to GPU), each starting after a random delay below 200 us. */
void run_kernel(const KernelSpec* spec, int device, uint32_t grid, uint32_t threads,
                std::shared_ptr<std::vector<char>> params, uint64_t launch) {
  Sms* sms = sms_of(device);
  std::vector<uint32_t> order(grid);
  for (uint32_t b = 0; b < grid; ++b) order[b] = b;
  Rng choices = rng_for(kChoiceBlocks, launch, 0x100000000ull + (uint64_t)device);
  if (schedule_seed())
    for (uint32_t k = grid; k > 1; --k) std::swap(order[k - 1], order[choices.below(k)]);
  std::vector<std::thread> blocks;
  blocks.reserve(grid);
  for (uint32_t b : order) {
    take_multiprocessor(sms, device);
    blocks.emplace_back(block_thread, spec, params, b, grid, threads, sms, device, launch);
  }
  for (std::thread& t : blocks) t.join();
}

}  // namespace emu

using namespace emu;

extern "C" {

/* Multiprocessors held by work other than our kernels: the loopback NCCL's collectives take
 * theirs while they run, as NCCL's kernels hold a multiprocessor per channel (CTA). They are
 * taken one at a time, as a launch's blocks take theirs, each waiting while none is free, and
 * given back together. Not part of the CUDA API: the emulated driver's own, for the loopback
 * NCCL, which finds them with dlsym (a `cu` name, so the driver's version script exports it). */
void cuEmuHoldMultiprocessors(int device, int count) {
  Sms* sms = sms_of(device);
  for (int i = 0; i < count; ++i) take_multiprocessor(sms, device);
}

void cuEmuReleaseMultiprocessors(int device, int count) {
  give_multiprocessors(sms_of(device), device, count);
}

}  // extern "C"

extern "C" {

CUresult cuModuleLoadData(CUmodule* out, const void* image) {
  EMU_FAULT("cuModuleLoadData");
  Context* c = nullptr;
  CUresult r = require_context(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
  const unsigned char* bytes = (const unsigned char*)image;
  Module* m = new Module();
  m->ctx = c;
  if (memcmp(bytes, ELFMAG, SELFMAG) == 0) {
    CUresult error = CUDA_SUCCESS;
    if (!cubin_kernels(bytes, &m->kernels, &error)) {
      delete m;
      return error;
    }
  } else if (strstr((const char*)image, ".version") && strstr((const char*)image, ".target")) {
    if (!ptx_kernels((const char*)image, &m->kernels)) {
      delete m;
      return CUDA_ERROR_NOT_FOUND;
    }
  } else {
    delete m;
    return CUDA_ERROR_INVALID_IMAGE;
  }
  std::lock_guard<std::mutex> g(*g_lock);
  g_modules->insert(m);
  *out = (CUmodule)m;
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hm) {
  EMU_FAULT("cuModuleUnload");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(*g_lock);
  Module* m = (Module*)hm;
  if (!m || !g_modules->count(m)) return CUDA_ERROR_INVALID_HANDLE;
  g_modules->erase(m);
  for (auto it = g_functions->begin(); it != g_functions->end();) {
    if ((*it)->module == m)
      it = g_functions->erase(it);
    else
      ++it;
  }
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* out, CUmodule hm, const char* name) {
  EMU_FAULT("cuModuleGetFunction");
  EMU_REQUIRE_INIT();
  if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_lock);
  Module* m = (Module*)hm;
  if (!m || !g_modules->count(m)) return CUDA_ERROR_INVALID_HANDLE;
  for (const KernelSpec* spec : m->kernels) {
    if (strcmp(spec->name, name) == 0) {
      Function* f = new Function();
      f->module = m;
      f->spec = spec;
      g_functions->insert(f);
      *out = (CUfunction)f;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}

CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction hf) {
  EMU_FAULT("cuFuncGetAttribute");
  EMU_REQUIRE_INIT();
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_lock);
  Function* f = (Function*)hf;
  if (!f || !g_functions->count(f)) return CUDA_ERROR_INVALID_HANDLE;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = (int)f->spec->max_threads; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = f->spec->max_threads == 512 ? 128 : 32; break;
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}

}  // extern "C"

namespace {
/* STRAGGLAR_EMU_COUNT_LAUNCHES=1: kernels run so far, by kernel (indices of kernel_specs),
 * printed to stderr when the process exits, one line per kernel run: an eager launch counts
 * when it runs, a captured one at each replay that runs it (none where its conditional
 * node's body does not run). */
constexpr size_t kMaxSpecs = 16;
std::atomic<uint64_t> g_launches[kMaxSpecs];

void print_launches() {
  size_t count = 0;
  const emu::KernelSpec* specs = emu::kernel_specs(&count);
  for (size_t i = 0; i < count && i < kMaxSpecs; ++i) {
    uint64_t n = g_launches[i].load();
    if (n) fprintf(stderr, "emulated CUDA driver: %llu launches of %s\n", (unsigned long long)n, specs[i].name);
  }
  if (uint64_t n = emu::multimem_stores()) {
    fprintf(stderr, "emulated CUDA driver: %llu multimem stores\n", (unsigned long long)n);
  }
}

/* STRAGGLAR_EMU_KERNEL_FAULT=NAME@N: the Nth launch (from 1) of kernel NAME in this process
 * faults when it runs (an illegal address): it does nothing, and its context is lost, every
 * later call on it failing with CUDA_ERROR_ILLEGAL_ADDRESS, as on a GPU. Whether launch
 * `spec` is that one. */
bool injected_fault(const emu::KernelSpec* spec) {
  static std::string name;
  static uint64_t at = 0;
  static std::atomic<uint64_t> launches{0};
  static const bool armed = [] {
    const char* v = getenv("STRAGGLAR_EMU_KERNEL_FAULT");
    const char* sep = v ? strchr(v, '@') : nullptr;
    if (!sep) return false;
    name.assign(v, (size_t)(sep - v));
    at = strtoull(sep + 1, nullptr, 10);
    return at > 0;
  }();
  return armed && name == spec->name && launches.fetch_add(1) + 1 == at;
}

void count_launch(const emu::KernelSpec* spec) {
  static const bool counting = [] {
    const char* v = getenv("STRAGGLAR_EMU_COUNT_LAUNCHES");
    bool on = v && strcmp(v, "1") == 0;
    if (on) atexit(print_launches);
    return on;
  }();
  if (!counting) return;
  size_t count = 0;
  const emu::KernelSpec* specs = emu::kernel_specs(&count);
  size_t i = (size_t)(spec - specs);
  if (i < count && i < kMaxSpecs) g_launches[i].fetch_add(1);
}
}  // namespace

extern "C" {

CUresult cuLaunchKernel(CUfunction hf, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        CUstream hs, void** params, void** extra) {
  EMU_FAULT("cuLaunchKernel");
  EMU_REQUIRE_INIT();
  const KernelSpec* spec = nullptr;
  {
    std::lock_guard<std::mutex> g(*g_lock);
    Function* f = (Function*)hf;
    if (!f || !g_functions->count(f)) return CUDA_ERROR_INVALID_HANDLE;
    spec = f->spec;
  }
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0)
    return CUDA_ERROR_INVALID_VALUE;
  /* The kernels of cuda/ are one-dimensional and use no dynamic shared memory. */
  if (gy != 1 || gz != 1 || by != 1 || bz != 1 || shared != 0 || extra)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (bx > spec->max_threads) return CUDA_ERROR_INVALID_VALUE;
  if (!params || !params[0]) return CUDA_ERROR_INVALID_VALUE;
  /* Arguments are copied at launch, as on a GPU. */
  auto bytes = std::make_shared<std::vector<char>>((const char*)params[0],
                                                   (const char*)params[0] + spec->param_bytes);
  std::lock_guard<std::mutex> g(capture_lock());
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  int device = s->ctx->device;
  Context* ctx = s->ctx;
  const bool faults = !s->capture && injected_fault(spec);
  static std::atomic<uint64_t> launches{0};
  const uint64_t launch = launches.fetch_add(1) + 1;
  CUresult submitted = submit(s, [spec, device, gx, bx, bytes, ctx, faults, launch] {
    if (faults) {
      fprintf(stderr, "emulated CUDA driver: %s faulted (an injected illegal address): the context is lost\n",
              spec->name);
      ctx->fault.store(CUDA_ERROR_ILLEGAL_ADDRESS);
      return;
    }
    count_launch(spec);
    run_kernel(spec, device, gx, bx, bytes, launch);
  }, CU_GRAPH_NODE_TYPE_KERNEL);
  return submitted;
}

}  // extern "C"
