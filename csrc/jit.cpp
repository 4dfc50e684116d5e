// See jit.h: NVRTC opened at run time, cubins cached per architecture, kernels per device.

#include "jit.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace bench_jit {
namespace {

// The NVRTC entry points the shim uses, resolved from libnvrtc.so.13 with dlsym.
struct Nvrtc {
  decltype(&nvrtcGetErrorString) error_string;
  decltype(&nvrtcGetNumSupportedArchs) num_archs;
  decltype(&nvrtcGetSupportedArchs) archs;
  decltype(&nvrtcCreateProgram) create;
  decltype(&nvrtcDestroyProgram) destroy;
  decltype(&nvrtcCompileProgram) compile;
  decltype(&nvrtcGetProgramLogSize) log_size;
  decltype(&nvrtcGetProgramLog) log;
  decltype(&nvrtcGetCUBINSize) cubin_size;
  decltype(&nvrtcGetCUBIN) cubin;
};

constexpr const char* kNvrtcSoname = "libnvrtc.so.13";

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// The folder of the loaded CUDA runtime: in the torch wheel's layout libnvrtc lies beside it
// (nvidia/cu13/lib), whatever LD_LIBRARY_PATH or the binary's rpath say.
std::string cudart_dir() {
  void* sym = dlsym(RTLD_DEFAULT, "cudaGetDeviceCount");
  Dl_info info;
  if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr) return "";
  return dir_of(info.dli_fname);
}

void* open_nvrtc() {
  // The loader's search first (LD_LIBRARY_PATH, the binary's rpath, an already loaded copy),
  // then beside the CUDA runtime.
  void* h = dlopen(kNvrtcSoname, RTLD_NOW | RTLD_LOCAL);
  if (h != nullptr) return h;
  const char* e = dlerror();
  std::string why = e ? e : "";
  auto dir = cudart_dir();
  if (!dir.empty()) {
    h = dlopen((dir + "/" + kNvrtcSoname).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return h;
    e = dlerror();
    why += std::string("; ") + (e ? e : "");
  }
  TORCH_CHECK(false, "cannot open ", kNvrtcSoname,
              " (NVRTC, shipped in the torch wheel's nvidia/cu13/lib; add that folder to "
              "LD_LIBRARY_PATH): ",
              why);
  return nullptr;
}

// NVRTC opens its built-in headers library (libnvrtc-builtins.so.MAJOR.MINOR) by name at the
// first compile, through the loader's search alone: without LD_LIBRARY_PATH it is not found
// even though it lies beside libnvrtc. Loading it first from there makes that lookup find
// the loaded copy (the loader matches its soname).
void preload_builtins(void* nvrtc_version_fn) {
  int major = 0, minor = 0;
  auto version = reinterpret_cast<decltype(&nvrtcVersion)>(nvrtc_version_fn);
  if (version(&major, &minor) != NVRTC_SUCCESS) return;
  std::string name =
      "libnvrtc-builtins.so." + std::to_string(major) + "." + std::to_string(minor);
  Dl_info info;
  if (dladdr(nvrtc_version_fn, &info) == 0 || info.dli_fname == nullptr) return;
  auto dir = dir_of(info.dli_fname);
  if (dir.empty()) return;
  // Failure here is not fatal: the loader's own search may still find it.
  if (dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) dlerror();
}

template <typename F>
void resolve(void* h, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(h, name));
  TORCH_CHECK(out != nullptr, kNvrtcSoname, " has no ", name);
}

const Nvrtc& nvrtc() {
  // A throwing initialiser leaves the static uninitialised, so a later call tries again.
  static const Nvrtc n = [] {
    void* h = open_nvrtc();
    void* version = dlsym(h, "nvrtcVersion");
    TORCH_CHECK(version != nullptr, kNvrtcSoname, " has no nvrtcVersion");
    preload_builtins(version);
    Nvrtc r{};
    resolve(h, "nvrtcGetErrorString", r.error_string);
    resolve(h, "nvrtcGetNumSupportedArchs", r.num_archs);
    resolve(h, "nvrtcGetSupportedArchs", r.archs);
    resolve(h, "nvrtcCreateProgram", r.create);
    resolve(h, "nvrtcDestroyProgram", r.destroy);
    resolve(h, "nvrtcCompileProgram", r.compile);
    resolve(h, "nvrtcGetProgramLogSize", r.log_size);
    resolve(h, "nvrtcGetProgramLog", r.log);
    resolve(h, "nvrtcGetCUBINSize", r.cubin_size);
    resolve(h, "nvrtcGetCUBIN", r.cubin);
    return r;
  }();
  return n;
}

void check_nvrtc(nvrtcResult rc, const char* what) {
  TORCH_CHECK(rc == NVRTC_SUCCESS, what, ": ", nvrtc().error_string(rc));
}

void check_cuda(cudaError_t rc, const char* what) {
  TORCH_CHECK(rc == cudaSuccess, what, ": ", cudaGetErrorString(rc));
}

bool log_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BENCH_JIT_LOG");
    return v != nullptr && std::string(v) != "0";
  }();
  return on;
}

struct Cache {
  std::mutex mu;
  // (key, arch) -> cubin
  std::map<std::pair<std::string, int>, std::string> cubins;
  // (key, device) -> kernels
  std::map<std::pair<std::string, int>, std::vector<cudaKernel_t>> kernels;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: kernels may be launched at exit
  return *c;
}

}  // namespace

std::string compile_cubin(const std::string& source, const std::string& name, int arch) {
  const auto& nv = nvrtc();
  int n = 0;
  check_nvrtc(nv.num_archs(&n), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(n));
  check_nvrtc(nv.archs(archs.data()), "nvrtcGetSupportedArchs");
  bool supported = false;
  for (int a : archs) supported = supported || a == arch;
  TORCH_CHECK(supported, "this NVRTC (", kNvrtcSoname, ") cannot compile for sm_", arch);

  nvrtcProgram prog = nullptr;
  check_nvrtc(nv.create(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  // Machine code for this exact architecture (no PTX for the driver to compile), fast math
  // (ex2.approx for the exponentials, flush-to-zero), and ptxas's resource report in the log.
  std::string arch_opt = "--gpu-architecture=sm_" + std::to_string(arch);
  const char* opts[] = {arch_opt.c_str(), "--std=c++17", "--use_fast_math",
                        "--ptxas-options=-v"};
  auto rc = nv.compile(prog, 4, opts);
  size_t log_len = 0;
  nv.log_size(prog, &log_len);
  std::string log(log_len, '\0');
  if (log_len > 0) nv.log(prog, &log[0]);
  if (rc != NVRTC_SUCCESS) {
    nv.destroy(&prog);
    TORCH_CHECK(false, "NVRTC failed to compile ", name, " for sm_", arch, ": ",
                nv.error_string(rc), "\n", log);
  }
  size_t size = 0;
  check_nvrtc(nv.cubin_size(prog, &size), "nvrtcGetCUBINSize");
  std::string cubin(size, '\0');
  check_nvrtc(nv.cubin(prog, &cubin[0]), "nvrtcGetCUBIN");
  nv.destroy(&prog);
  if (log_enabled()) std::fprintf(stderr, "[jit] %s sm_%d ptxas:\n%s\n", name.c_str(), arch, log.c_str());
  return cubin;
}

const std::vector<cudaKernel_t>& kernels(const std::string& key, const std::string& source,
                                         const std::vector<std::string>& names, int device) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto found = c.kernels.find({key, device});
  if (found != c.kernels.end()) return found->second;

  cudaDeviceProp prop;
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int arch = prop.major * 10 + prop.minor;
  auto cb = c.cubins.find({key, arch});
  if (cb == c.cubins.end()) {
    auto t0 = std::chrono::steady_clock::now();
    auto cubin = compile_cubin(source, key, arch);
    if (log_enabled()) {
      auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
      std::fprintf(stderr, "[jit] %s compiled for sm_%d in %.0f ms (%zu bytes)\n", key.c_str(),
                   arch, ms.count(), cubin.size());
    }
    cb = c.cubins.emplace(std::make_pair(key, arch), std::move(cubin)).first;
  }

  int prev = 0;
  check_cuda(cudaGetDevice(&prev), "cudaGetDevice");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaLibrary_t lib = nullptr;
  std::vector<cudaKernel_t> ks;
  auto loaded = cudaLibraryLoadData(&lib, cb->second.data(), nullptr, nullptr, 0, nullptr,
                                    nullptr, 0);
  if (loaded == cudaSuccess) {
    for (const auto& n : names) {
      cudaKernel_t k = nullptr;
      loaded = cudaLibraryGetKernel(&k, lib, n.c_str());
      if (loaded != cudaSuccess) break;
      // Asking for the attributes loads the kernel into this device's context now, so that
      // a first launch under CUDA-graph capture finds it loaded; it also gives the register
      // count for the log.
      cudaFuncAttributes attr;
      loaded = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(k));
      if (loaded != cudaSuccess) break;
      if (log_enabled())
        std::fprintf(stderr, "[jit] %s: %d registers, %zu bytes local, %zu bytes static shared\n",
                     n.c_str(), attr.numRegs, attr.localSizeBytes, attr.sharedSizeBytes);
      ks.push_back(k);
    }
  }
  cudaSetDevice(prev);
  check_cuda(loaded, ("loading the kernels of " + key).c_str());
  // The library stays loaded for the life of the process (its kernels are cached here).
  return c.kernels.emplace(std::make_pair(key, device), std::move(ks)).first->second;
}

void launch(cudaKernel_t k, dim3 grid, dim3 block, void** args, size_t smem,
            cudaStream_t stream) {
  check_cuda(cudaLaunchKernel(reinterpret_cast<const void*>(k), grid, block, args, smem, stream),
             "cudaLaunchKernel");
}

}  // namespace bench_jit
