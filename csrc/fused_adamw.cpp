// AdamW over fp32 master weights held in flat buffers, from the bf16 gradients the backward
// leaves on the bf16 working parameters, writing the updated bf16 working copy in the same
// pass.
//
// Mixed precision the usual way costs three passes over every parameter per step: the
// backward's cast of each bf16 gradient to fp32 (read 2 bytes, write 4), libtorch's fused
// AdamW over fp32 tensors (read 16, write 12) and the next forward's cast of each master to
// bf16 (read 4, write 2): 40 bytes a parameter. Here one kernel reads the bf16 gradient and
// the fp32 master and moments and writes the master, the moments and the bf16 working copy:
// 28 bytes. For the Llama proxy's 1.9 B parameters that is 23 GB less traffic a step.
//
// The gradients are wherever the backward put them (the parameters' own `.grad`, handed over
// rather than copied), so the kernel takes a table of (gradient pointer, offset into the flat
// buffers, length, weight decay) by value as its launch argument, up to kMaxEntries tensors a
// launch. Under CUDA-graph capture the table is baked into the kernel node; the gradients
// the captured backward allocates come from the graph's pool at the same addresses on every
// replay, as libtorch's own fused optimizer relies on too.
//
// With gradient accumulation the bf16 gradients of each micro-batch are added into an fp32
// buffer first (mode kAccAssign, then kAccAdd), so the sum is kept in fp32, and the update
// reads that buffer (kUpdateFromAcc).

#include "fused.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "device_types.h"
#include "jit.h"

namespace bench_fused {
namespace {

constexpr int kMaxEntries = 96;
constexpr int kThreads = 256;
// Elements per block: each thread takes four runs of four consecutive elements.
constexpr int kChunk = kThreads * 4 * 4;

// Must match `Entry` and `Table` in the kernel source below.
struct Entry {
  const void* grad;
  uint64_t offset;
  uint32_t numel;
  float weight_decay;
};
struct Table {
  uint32_t count;
  // Block b works on entry e where start[e] <= b < start[e + 1].
  uint32_t start[kMaxEntries + 1];
  Entry e[kMaxEntries];
};
static_assert(sizeof(Table) <= 4096 - 128, "the table must fit the 4 KiB kernel arguments");

const char* kSource = R"CUDA(
#define MAX_ENTRIES 96
#define CHUNK (256 * 16)
struct Entry { const u16* grad; u64 offset; u32 numel; float weight_decay; };
struct Table { u32 count; u32 start[MAX_ENTRIES + 1]; Entry e[MAX_ENTRIES]; };

__device__ __forceinline__ float bf(u16 v) { return __uint_as_float(((u32)v) << 16); }

__device__ __forceinline__ void adamw(float& p, float& m, float& v, float g, float decay,
                                      float lr, float b1, float b2, float eps,
                                      float step_size, float bc2_sqrt) {
  // torch.optim.AdamW's fused CUDA kernel, term for term.
  p -= lr * decay * p;
  m = b1 * m + (1.f - b1) * g;
  v = b2 * v + (1.f - b2) * g * g;
  const float denom = sqrtf(v) / bc2_sqrt + eps;
  p -= step_size * m / denom;
}

// mode 0: update from the table's bf16 gradients; 1: acc = grad; 2: acc += grad;
// 3: update from acc (the table's gradient pointers unused).
extern "C" __global__ void __launch_bounds__(256)
master_adamw(const Table t, float* __restrict__ master, float* __restrict__ exp_avg,
             float* __restrict__ exp_avg_sq, u16* __restrict__ work, float* __restrict__ acc,
             const float* __restrict__ step, float lr, float b1, float b2, float eps, int mode) {
  // The entry of this block: a binary search over the launch's block starts.
  u32 lo = 0, hi = t.count;
  while (hi - lo > 1) {
    u32 mid = (lo + hi) / 2;
    if (t.start[mid] <= blockIdx.x) lo = mid; else hi = mid;
  }
  const Entry e = t.e[lo];
  const u64 base = (u64)(blockIdx.x - t.start[lo]) * CHUNK;
  float step_size = 0.f, bc2_sqrt = 1.f;
  if (mode == 0 || mode == 3) {
    const float s = *step;
    step_size = lr / (1.f - powf(b1, s));
    bc2_sqrt = sqrtf(1.f - powf(b2, s));
  }
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const u64 i = base + ((u64)it * 256 + threadIdx.x) * 4;
    if (i >= e.numel) break;
    const u64 k = e.offset + i;
    float g[4];
    const bool full = i + 4 <= e.numel;
    const int n = full ? 4 : (int)(e.numel - i);
    if (mode == 3) {
      if (full) {
        const float4 q = *(const float4*)(acc + k);
        g[0] = q.x; g[1] = q.y; g[2] = q.z; g[3] = q.w;
      } else {
        for (int j = 0; j < n; ++j) g[j] = acc[k + j];
      }
    } else if (full) {
      const uint2 q = *(const uint2*)(e.grad + i);
      g[0] = __uint_as_float(q.x << 16); g[1] = __uint_as_float(q.x & 0xffff0000u);
      g[2] = __uint_as_float(q.y << 16); g[3] = __uint_as_float(q.y & 0xffff0000u);
    } else {
      for (int j = 0; j < n; ++j) g[j] = bf(e.grad[i + j]);
    }
    if (mode == 1 || mode == 2) {
      if (full) {
        float4* a = (float4*)(acc + k);
        float4 q = mode == 2 ? *a : make_float4(0.f, 0.f, 0.f, 0.f);
        q.x += g[0]; q.y += g[1]; q.z += g[2]; q.w += g[3];
        *a = q;
      } else {
        for (int j = 0; j < n; ++j) acc[k + j] = (mode == 2 ? acc[k + j] : 0.f) + g[j];
      }
      continue;
    }
    if (full) {
      float4 p = *(const float4*)(master + k);
      float4 m = *(const float4*)(exp_avg + k);
      float4 v = *(const float4*)(exp_avg_sq + k);
      adamw(p.x, m.x, v.x, g[0], e.weight_decay, lr, b1, b2, eps, step_size, bc2_sqrt);
      adamw(p.y, m.y, v.y, g[1], e.weight_decay, lr, b1, b2, eps, step_size, bc2_sqrt);
      adamw(p.z, m.z, v.z, g[2], e.weight_decay, lr, b1, b2, eps, step_size, bc2_sqrt);
      adamw(p.w, m.w, v.w, g[3], e.weight_decay, lr, b1, b2, eps, step_size, bc2_sqrt);
      *(float4*)(master + k) = p;
      *(float4*)(exp_avg + k) = m;
      *(float4*)(exp_avg_sq + k) = v;
      uint2 w;
      w.x = Bf16::put2(p.x, p.y);
      w.y = Bf16::put2(p.z, p.w);
      *(uint2*)(work + k) = w;
    } else {
      for (int j = 0; j < n; ++j) {
        float p = master[k + j], m = exp_avg[k + j], v = exp_avg_sq[k + j];
        adamw(p, m, v, g[j], e.weight_decay, lr, b1, b2, eps, step_size, bc2_sqrt);
        master[k + j] = p;
        exp_avg[k + j] = m;
        exp_avg_sq[k + j] = v;
        work[k + j] = Bf16::put(p);
      }
    }
  }
}
)CUDA";

const std::vector<cudaKernel_t>& adamw_kernels(int device) {
  static const std::vector<std::string> names = {"master_adamw"};
  return bench_jit::kernels("master_adamw", master_adamw_source(), names, device);
}

}  // namespace

void master_adamw(const std::vector<at::Tensor>& grads, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& numels, const std::vector<double>& weight_decays,
                  const at::Tensor& master, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, const at::Tensor& work, const at::Tensor& acc,
                  const at::Tensor& step, double lr, double beta1, double beta2, double eps,
                  int64_t mode) {
  // Mode 4 is mode 0 over a part of the entries, with the step already counted: the update
  // overlapped with the backward launches it once per stage of the model, and the step
  // count must rise once per step, not once per launch.
  TORCH_CHECK(mode >= 0 && mode <= 4, "master AdamW: mode ", mode, " is not 0..4");
  const bool counted = mode == 4;
  if (counted) mode = 0;
  const size_t n = offsets.size();
  TORCH_CHECK(numels.size() == n && weight_decays.size() == n,
              "master AdamW: entry lists differ in length");
  const bool from_grads = mode != 3;
  TORCH_CHECK(!from_grads || grads.size() == n, "master AdamW: ", grads.size(),
              " gradients for ", n, " entries");
  TORCH_CHECK(master.is_cuda() && master.scalar_type() == at::kFloat && master.is_contiguous(),
              "master AdamW: the masters must be one contiguous fp32 CUDA tensor");
  const int64_t total = master.numel();
  for (const auto* t : {&exp_avg, &exp_avg_sq}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == total &&
                    t->device() == master.device(),
                "master AdamW: moments must be contiguous fp32 like the masters");
  }
  TORCH_CHECK(work.scalar_type() == at::kBFloat16 && work.is_contiguous() &&
                  work.numel() == total && work.device() == master.device(),
              "master AdamW: the working copy must be contiguous bf16 like the masters");
  const bool uses_acc = mode != 0;
  if (uses_acc) {
    TORCH_CHECK(acc.defined() && acc.scalar_type() == at::kFloat && acc.is_contiguous() &&
                    acc.numel() == total && acc.device() == master.device(),
                "master AdamW: the accumulator must be contiguous fp32 like the masters");
  }
  TORCH_CHECK(step.scalar_type() == at::kFloat && step.numel() == 1 &&
                  step.device() == master.device(),
              "master AdamW: the step count must be one fp32 number on the masters' device");
  c10::cuda::CUDAGuard guard(master.device());
  const int device = master.get_device();
  auto stream = at::cuda::getCurrentCUDAStream(device).stream();
  // Gradients off the 8-byte grid (never seen from the backward, which allocates them) are
  // copied, so the kernel's vector loads stay aligned.
  std::vector<at::Tensor> held;
  if (from_grads) {
    held.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& g = grads[i];
      TORCH_CHECK(g.defined(), "master AdamW: entry ", i, " has no gradient");
      TORCH_CHECK(g.device() == master.device() && g.scalar_type() == at::kBFloat16 &&
                      g.numel() == numels[i],
                  "master AdamW: gradient ", i, " is not bf16 of ", numels[i],
                  " elements on the masters' device");
      auto c = g.contiguous();
      if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 8 != 0) c = c.clone();
      held.push_back(c);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(offsets[i] % 4 == 0 && offsets[i] >= 0 && numels[i] >= 0 &&
                    offsets[i] + numels[i] <= total && numels[i] < (int64_t{1} << 32),
                "master AdamW: entry ", i, " (offset ", offsets[i], ", ", numels[i],
                " elements) is off the flat buffers or their 4-element grid");
  }
  if ((mode == 0 && !counted) || mode == 3) step.add_(1.0);
  const auto& k = adamw_kernels(device)[0];
  void* mp = master.data_ptr();
  void* m1 = exp_avg.data_ptr();
  void* m2 = exp_avg_sq.data_ptr();
  void* wp = work.data_ptr();
  void* ap = uses_acc ? acc.data_ptr() : nullptr;
  const void* sp = step.data_ptr();
  float flr = static_cast<float>(lr), fb1 = static_cast<float>(beta1),
        fb2 = static_cast<float>(beta2), feps = static_cast<float>(eps);
  int imode = static_cast<int>(mode);
  for (size_t first = 0; first < n; first += kMaxEntries) {
    Table t{};
    uint64_t blocks = 0;
    const size_t last = std::min(n, first + kMaxEntries);
    for (size_t i = first; i < last; ++i) {
      const size_t j = i - first;
      t.start[j] = static_cast<uint32_t>(blocks);
      t.e[j] = Entry{from_grads ? held[i].data_ptr() : nullptr,
                     static_cast<uint64_t>(offsets[i]), static_cast<uint32_t>(numels[i]),
                     static_cast<float>(weight_decays[i])};
      blocks += (static_cast<uint64_t>(numels[i]) + kChunk - 1) / kChunk;
      TORCH_CHECK(blocks < (uint64_t{1} << 31), "master AdamW: too many blocks in one launch");
    }
    t.count = static_cast<uint32_t>(last - first);
    t.start[t.count] = static_cast<uint32_t>(blocks);
    if (blocks == 0) continue;
    void* args[] = {&t, &mp, &m1, &m2, &wp, &ap, &sp, &flr, &fb1, &fb2, &feps, &imode};
    bench_jit::launch(k, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), args, 0, stream);
  }
}

std::string master_adamw_source() { return std::string(device_types_source()) + kSource; }

}  // namespace bench_fused
