/* The bridge between the driver (which sees cuda.h) and the kernel source (which must not). */
#ifndef STRAGGLAR_EMU_KERNEL_SOURCE_H_
#define STRAGGLAR_EMU_KERNEL_SOURCE_H_

#include <cstddef>
#include <cstdint>

namespace emu {

enum class KernelId { AllReduce, Ticket, TicketEnd, Delay, ApplyProbe, Fault };

/* A kernel of cuda/ (or the driver self-test's) the emulated GPU can run: its entry name, its one parameter's size in
 * bytes, and the most threads a block may have (its __launch_bounds__, else 1024). */
struct KernelSpec {
  const char* name;
  KernelId id;
  size_t param_bytes;
  uint32_t max_threads;
};

const KernelSpec* kernel_specs(size_t* count);

/* Runs block `block` of a `blocks`-block launch of `k` with `threads` threads on the calling
 * thread (as fibers); returns when every thread of the block has returned. */
void run_block(const KernelSpec* k, const void* params, uint32_t block, uint32_t blocks,
               uint32_t threads);

}  // namespace emu

#endif
