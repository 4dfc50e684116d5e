// CUDA C++ source shared by the run-time compiled kernels (prepended to each kernel's own
// source before NVRTC sees it): integer types, and element access for bf16 and fp32 as
// 16-byte vectors of 8 or 4 elements, converted to and from fp32 without CUDA's headers
// (they are large and slow to compile; the conversions are single instructions).

#pragma once

namespace bench_fused {

inline const char* device_types_source() {
  return R"CUDA(
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define LOG2E 1.4426950408889634f

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

struct Bf16 {
  typedef u16 E;
  typedef uint4 Vec;
  enum { N = 8 };
  __device__ static float get(E v) { return __uint_as_float(((u32)v) << 16); }
  __device__ static E put(float f) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
  }
  __device__ static u32 put2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  __device__ static void unpack(const Vec& v, float* f) {
    f[0] = __uint_as_float(v.x << 16); f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16); f[3] = __uint_as_float(v.y & 0xffff0000u);
    f[4] = __uint_as_float(v.z << 16); f[5] = __uint_as_float(v.z & 0xffff0000u);
    f[6] = __uint_as_float(v.w << 16); f[7] = __uint_as_float(v.w & 0xffff0000u);
  }
  __device__ static Vec pack(const float* f) {
    Vec v;
    v.x = put2(f[0], f[1]); v.y = put2(f[2], f[3]);
    v.z = put2(f[4], f[5]); v.w = put2(f[6], f[7]);
    return v;
  }
};

struct F32 {
  typedef float E;
  typedef float4 Vec;
  enum { N = 4 };
  __device__ static float get(E v) { return v; }
  __device__ static E put(float f) { return f; }
  __device__ static void unpack(const Vec& v, float* f) { f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w; }
  __device__ static Vec pack(const float* f) { return make_float4(f[0], f[1], f[2], f[3]); }
};


// The fp32 per-column values (weights, biases) of vector v's N columns.
template <class T>
__device__ __forceinline__ void load_w(const float* __restrict__ w, int v, float* out) {
  const float4* p = (const float4*)(w + v * T::N);
#pragma unroll
  for (int i = 0; i < T::N / 4; ++i) {
    float4 q = p[i];
    out[4 * i] = q.x; out[4 * i + 1] = q.y; out[4 * i + 2] = q.z; out[4 * i + 3] = q.w;
  }
}
)CUDA";
}

}  // namespace bench_fused
