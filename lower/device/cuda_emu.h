// cuda_emu.h: run the CUDA C emitted by lower/cuda.py as plain C++ on the CPU (the numerics check without a GPU).
//
// Compile the unmodified .cu as C++:  g++ -std=c++17 -O1 -fPIC -shared -include cuda_emu.h launcher.cpp
// where launcher.cpp #includes the .cu and wraps each kernel (lower/cuda_driver.py generates it).
//
// * threadIdx / blockIdx / blockDim / gridDim are globals; `__shared__` is `static`: blocks run one after another on one
//   OS thread, so there is exactly one copy per resident block, as on the GPU.
// * Each CUDA thread of a block is a fiber (its own stack; a hand-written register switch on x86-64, ucontext
//   elsewhere). `__syncthreads()` yields; the block resumes when every live thread waits at the barrier (threads
//   that returned count as arrived). `__syncwarp()` and the `__shfl_*_sync` intrinsics use a
//   warp-scope barrier plus an exchange buffer. A barrier nobody can pass aborts with "deadlock".
// * The schedule is deterministic: thread 0 runs to its next barrier, then thread 1, ... so a missing barrier between
//   a shared-memory write and a read by another thread shows up as a wrong result.
// * Kernels without barriers (the emitter knows which) run as one plain call per thread, no fibers.
// Limits: no concurrency or memory model inside a block, no inter-block races, full warp masks only, no dynamic
// `extern __shared__`, no inline PTX / tensor cores / cooperative groups.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <cmath>
#include <vector>
#include <ucontext.h>

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)

namespace cs_emu {
enum State { RUN = 0, WAIT_BLOCK = 1, WAIT_WARP = 2, DONE = 3 };
#if defined(__x86_64__) && !defined(CS_EMU_UCONTEXT)
// A 6-register + rsp switch (glibc swapcontext makes an rt_sigprocmask syscall on every switch: ~10x slower here).
extern "C" void cs_emu_switch(void** save_sp, void* new_sp);
asm(".text\n.p2align 4\n.type cs_emu_switch,@function\n.hidden cs_emu_switch\ncs_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size cs_emu_switch, .-cs_emu_switch\n");
struct Ctx { void* sp; };
inline void ctx_switch(Ctx* from, Ctx* to) { cs_emu_switch(&from->sp, to->sp); }
inline void ctx_make(Ctx* c, char* stack, size_t size, void (*entry)()) {
  uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
  void** sp = (void**)(top - 8 * sizeof(void*));
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;       // r15 r14 r13 r12 rbx rbp
  sp[6] = (void*)entry;                               // `ret` enters here with rsp % 16 == 8, as after a call
  sp[7] = nullptr;
  c->sp = sp;
}
#else
struct Ctx { ucontext_t uc; };
inline void ctx_switch(Ctx* from, Ctx* to) { swapcontext(&from->uc, &to->uc); }
inline void ctx_make(Ctx* c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack; c->uc.uc_stack.ss_size = size; c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif
struct Fiber { Ctx ctx; int state; uint3 idx; };
inline Ctx sched;
inline std::vector<Fiber> fibers;
inline std::vector<char> stacks;
inline std::vector<unsigned long long> xchg;     // shuffle exchange: one 8-byte slot per thread
inline int cur = -1;
inline bool with_fibers = false;
inline void (*fn)(void**) = nullptr;
inline void** args = nullptr;
inline unsigned long long switches = 0, barriers = 0;
constexpr size_t STACK = 256 * 1024;

inline unsigned tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline unsigned nthreads() { return blockDim.x * blockDim.y * blockDim.z; }

inline void wait(int s) {
  if (!with_fibers) { fprintf(stderr, "cuda_emu: barrier in a kernel launched without fibers\n"); abort(); }
  fibers[cur].state = s;
  ++switches;
  ctx_switch(&fibers[cur].ctx, &sched);
}

inline void trampoline() {   // a fiber's entry: never returns, switches back to the scheduler for good
  fn(args);
  fibers[cur].state = DONE;
  ctx_switch(&fibers[cur].ctx, &sched);
  abort();
}

inline void run_block() {
  const unsigned n = nthreads();
  if (!with_fibers) {
    for (unsigned t = 0; t < n; ++t) {
      threadIdx = uint3{t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
      fn(args);
    }
    return;
  }
  if (fibers.size() < n) fibers.resize(n);
  if (stacks.size() < n * STACK) stacks.resize(n * STACK);
  if (xchg.size() < n) xchg.resize(n);
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = fibers[t];
    ctx_make(&f.ctx, stacks.data() + (size_t)t * STACK, STACK, trampoline);
    f.state = RUN;
    f.idx = uint3{t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
  }
  for (;;) {
    for (unsigned t = 0; t < n; ++t) {
      if (fibers[t].state != RUN) continue;
      cur = (int)t; threadIdx = fibers[t].idx; ++switches;
      ctx_switch(&sched, &fibers[t].ctx);
    }
    bool all_done = true, released = false;
    for (unsigned t = 0; t < n; ++t) all_done &= fibers[t].state == DONE;
    if (all_done) break;
    // warps whose live threads all wait at a warp barrier go on
    for (unsigned w = 0; w * 32 < n; ++w) {
      bool any = false, all = true;
      for (unsigned t = w * 32; t < n && t < w * 32 + 32; ++t) {
        if (fibers[t].state == DONE) continue;
        any = true; all &= fibers[t].state == WAIT_WARP;
      }
      if (any && all) {
        for (unsigned t = w * 32; t < n && t < w * 32 + 32; ++t) if (fibers[t].state == WAIT_WARP) fibers[t].state = RUN;
        released = true;
      }
    }
    if (released) continue;
    bool all_block = true;
    for (unsigned t = 0; t < n; ++t) all_block &= fibers[t].state == DONE || fibers[t].state == WAIT_BLOCK;
    if (all_block) {
      ++barriers;
      for (unsigned t = 0; t < n; ++t) if (fibers[t].state == WAIT_BLOCK) fibers[t].state = RUN;
      continue;
    }
    fprintf(stderr, "cuda_emu: deadlock in block (%u,%u,%u): threads wait at different barriers\n", blockIdx.x, blockIdx.y, blockIdx.z);
    abort();
  }
}

inline void launch(dim3 grid, dim3 block, void (*f)(void**), void** a, bool fib) {
  gridDim = grid; blockDim = block; fn = f; args = a; with_fibers = fib;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) { blockIdx = uint3{x, y, z}; run_block(); }
}

template <class T> inline T shfl(T v, int src_lane, int width) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  const unsigned t = tid(), lane = t % 32, base = t - lane;
  memcpy(&xchg[t], &v, sizeof(T));
  wait(WAIT_WARP);
  T r = v;
  const unsigned seg = lane - lane % (unsigned)width;
  if (src_lane >= 0 && (unsigned)src_lane < (unsigned)width && base + seg + src_lane < nthreads())
    memcpy(&r, &xchg[base + seg + src_lane], sizeof(T));
  wait(WAIT_WARP);   // nobody overwrites a slot before every lane has read it
  return r;
}
}  // namespace cs_emu

inline void __syncthreads() { cs_emu::wait(cs_emu::WAIT_BLOCK); }
inline void __syncwarp(unsigned = 0xffffffffu) { cs_emu::wait(cs_emu::WAIT_WARP); }
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
  const int lane = (int)(cs_emu::tid() % 32 % (unsigned)width);
  return cs_emu::shfl(v, lane + (int)d < width ? lane + (int)d : lane, width);
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
  const int lane = (int)(cs_emu::tid() % 32 % (unsigned)width);
  return cs_emu::shfl(v, lane - (int)d >= 0 ? lane - (int)d : lane, width);
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
  const int lane = (int)(cs_emu::tid() % 32 % (unsigned)width);
  return cs_emu::shfl(v, lane ^ m, width);
}
template <class T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) { return cs_emu::shfl(v, src % width, width); }
template <class T> inline T __ldg(const T* p) { return *p; }
