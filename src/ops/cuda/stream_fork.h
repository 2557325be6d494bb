// The CUDA side of ops::Fork (ops/stream_fork.h): this thread's side stream, the ordering of one
// stream after another, and the scratch lane of the thread's ops. No CUDA headers: streams are
// opaque cudaStream_t values (null: the legacy default stream).
#pragma once

namespace osprey::ops::cuda {

// This thread's side stream (non-blocking, created on first use, kept for the thread's life).
void* side_stream();
// `after` waits for everything issued so far on `before` (an event recorded on `before`, waited
// on by `after`; inside a capture, a graph edge). Events come from a per-thread ring, re-recorded
// only after their wait was issued.
void stream_after(void* after, void* before);
// Scratch lanes (common.cuh scratch): each lane has its own slots; a thread's ops take lane 0
// unless an ops::Fork side scope set lane 1. Per-lane device state outside the arena (the swap-AB
// split-K counters) follows the same lane. set_scratch_lane returns the previous lane.
constexpr int kScratchLanes = 2;
int scratch_lane();
int set_scratch_lane(int lane);

}  // namespace osprey::ops::cuda
