// Private: timed waits that end when they were asked to, for the threads on a transfer's path.
//
// Linux lets a timed sleep end up to the thread's timer slack late (50 us by default), so that
// wake-ups can be batched. A 50 us timed wait took ~126 us here with the default slack (p50 of
// 2,000 condition-variable waits on the project VM) and ~73 us with a slack of 1 ns, the rest
// being the wake-up itself. The fabric worker naps 50 us at a time while a long transfer
// produces no completion (worker.hpp), so the end of every such transfer was noticed up to a
// whole slack late: DMA.GET of 1 MiB on shm went from 433-477 us p50 to 370-403 us with it
// (docs/PERFORMANCE.md, "Timer slack and the doorbell"). A Target's progress thread keeps the
// default: its timed polls are the fallback for initiators that do not ring its doorbell
// (liveness_mark.hpp), and polling idle targets more often slowed everything else on the
// machine (plain GET p50 35 -> 54 us beside four idle clients). prctl(PR_SET_TIMERSLACK) is
// per thread and costs nothing at run time.
// Thread-safety: affects the calling thread only.
#pragma once

namespace dma::internal {

// Sets the calling thread's timer slack to the kernel's minimum (1 ns). Best effort: a kernel
// that refuses leaves the default, which is only slower.
void use_precise_timers() noexcept;

}  // namespace dma::internal
