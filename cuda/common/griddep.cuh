// fusedkit/cuda/common/griddep.cuh
// Programmatic dependent launch (PDL, sm_90+): a kernel launched with the programmatic-stream-
// serialization attribute (fusedkit/_launch.py, Launcher(..., dependent=True)) may start while the
// kernel before it on the stream still runs, as soon as every CTA of that kernel has called
// griddep_launch_dependents() (or exited). It then must call griddep_wait() before it reads anything the
// kernel before it writes; everything that kernel *reads* was complete before it started, because
// fusedkit launches the first kernel of such a chain without the attribute.
//
// Rules for a dependent kernel (kept by review; the compiler cannot check them):
//   - before griddep_wait(): read only the call's inputs; write only memory the kernel before does not
//     touch;
//   - griddep_wait() in every thread that later reads the earlier kernel's output (it is per thread).
//   - read that output with coherent loads (__ldcg, plain ld), never the read-only path (ld.global.nc,
//     what `const __restrict__` pointers may compile to): it was written during this kernel's lifetime.
// Without the attribute (and off sm_90) both calls are no-ops, so the same kernel serves plain launches.
#pragma once

// FK_GRIDDEP_WAIT=0 compiles the waits out: only to show that the dependent-launch tests fail without
// them (tests/test_cross_entropy.py test_dependent_launches, tests/test_norms.py
// test_column_sum_dependent_launch, with TEST_OPTIONS="-DFK_GRIDDEP_WAIT=0" in tools/gpu_check.sh).
#ifndef FK_GRIDDEP_WAIT
#define FK_GRIDDEP_WAIT 1
#endif

namespace fk {

// Lets the next kernel on the stream (if launched as a dependent) start once every CTA got here.
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the kernel before this one on the stream has completed and its writes are visible.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && FK_GRIDDEP_WAIT
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace fk
