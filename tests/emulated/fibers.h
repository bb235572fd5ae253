/* Fibers for the emulated GPU: one OS thread runs a block's GPU threads, switching from one to
 * the next at the block barrier and at pauses (spin waits), so a grid of 17 blocks of 512
 * threads needs 17 OS threads, not 8,704. */
#ifndef STRAGGLAR_EMU_FIBERS_H_
#define STRAGGLAR_EMU_FIBERS_H_

#include <cstdint>

#include "schedule.h"

namespace emu {

/* Runs `threads` fibers on the calling thread, fiber i calling body(arg, i) after
 * on_switch(arg, i) (and on_switch again each time it is resumed), until every fiber returned.
 * Inside a body, fiber_sync() is the plan barrier of the first `syncing` fibers (the others
 * never take part: a warp doing other work; one of them returning while others wait there
 * aborts, as the GPU's counted barrier would hang) and
 * fiber_pause() lets the others run; when every fiber only pauses, the OS thread yields and
 * then sleeps briefly, so a block that spins on another rank does not starve it. Each round
 * resumes the runnable fibers in index order, or, given `order` (seeded scheduling), in an
 * order drawn from it. */
void run_fibers(uint32_t threads, uint32_t syncing, void (*body)(void* arg, uint32_t thread),
                void (*on_switch)(void* arg, uint32_t thread), void* arg, Rng* order);
void fiber_sync();
/* The whole block's barrier (__syncthreads): every fiber, none of them returned, none held at
 * the plan barrier (either aborts: the GPU would hang). */
void fiber_sync_all();
/* From now on the plan barrier (fiber_sync) is for the first `syncing` fibers (every fiber
 * sets the same count, with nobody waiting there). */
void fiber_set_syncing(uint32_t syncing);
void fiber_pause();

}  // namespace emu

#endif
