// A CPU stand-in for the CUDA built-ins the generated kernels use, so
// that `g++ -std=c++20` compiles the very same source (test only: see
// emulate.rs). Blocks run one after another; a kernel that synchronises
// (__syncthreads, warp shuffles) runs each block's threads as OS threads
// with barriers, the others run their threads in a plain loop.
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#include <math.h>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static thread_local_shared

struct go_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local go_dim3 threadIdx, blockIdx;
inline go_dim3 blockDim, gridDim;

// __shared__ arrays: one per kernel, shared by the block's threads, reused
// by the next block (blocks run in turn). `static` inside a function is
// shared by all threads already; the marker only documents it.
#define thread_local_shared

struct go_block {
  std::barrier<>* block = nullptr;
  std::vector<std::barrier<>*> warps;
  unsigned long long slot[1024];
};
inline thread_local go_block* go_ctx = nullptr;

inline void __syncthreads() {
  if (go_ctx) go_ctx->block->arrive_and_wait();
}

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  int t = threadIdx.x, w = t >> 5;
  std::memcpy(&go_ctx->slot[t], &v, sizeof(T));
  go_ctx->warps[w]->arrive_and_wait();
  T r;
  std::memcpy(&r, &go_ctx->slot[(t & ~31) | ((t & 31) ^ o)], sizeof(T));
  go_ctx->warps[w]->arrive_and_wait();
  return r;
}

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// IEEE half <-> float, round to nearest even (what cvt.rn.f16.f32 does).
inline float h2f(unsigned short h) {
  unsigned s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
  if (e == 0) {
    if (m == 0) u = s;
    else {
      int k = -1;
      do { ++k; m <<= 1; } while (!(m & 0x400));
      u = s | ((unsigned)(127 - 15 - k) << 23) | ((m & 0x3ff) << 13);
    }
  } else if (e == 31) u = s | 0x7f800000u | (m << 13);
  else u = s | ((e + 112) << 23) | (m << 13);
  return __uint_as_float(u);
}
inline unsigned short f2h(float f) {
  unsigned u = __float_as_uint(f), s = (u >> 16) & 0x8000u;
  unsigned a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u);
  if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);  // rounds to inf
  if (a < 0x38800000u) {  // subnormal or zero
    if (a < 0x33000001u) return (unsigned short)s;
    unsigned e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    unsigned r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return (unsigned short)(s | r);
  }
  unsigned r = ((a - 0x38000000u) >> 13);
  unsigned rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) ++r;
  return (unsigned short)(s | r);
}

template <class F>
inline void go_launch(unsigned gx, unsigned gy, unsigned gz, unsigned b, bool threaded, F f) {
  gridDim = {gx, gy, gz};
  blockDim = {b, 1, 1};
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        if (!threaded) {
          for (unsigned t = 0; t < b; ++t) {
            blockIdx = {x, y, z};
            threadIdx = {t, 0, 0};
            f();
          }
          continue;
        }
        go_block ctx;
        std::barrier<> block((std::ptrdiff_t)b);
        ctx.block = &block;
        std::vector<std::barrier<>*> warps;
        for (unsigned w = 0; w < (b + 31) / 32; ++w) {
          unsigned n = (w + 1) * 32 <= b ? 32 : b - w * 32;
          warps.push_back(new std::barrier<>((std::ptrdiff_t)n));
        }
        ctx.warps = warps;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < b; ++t)
          th.emplace_back([&, t] {
            blockIdx = {x, y, z};
            threadIdx = {t, 0, 0};
            go_ctx = &ctx;
            f();
            go_ctx = nullptr;
          });
        for (auto& t : th) t.join();
        for (auto* w : warps) delete w;
      }
}
