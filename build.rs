//! Link settings for libtorch, and the C++ shim (csrc/shim.cpp).
//!
//! libtorch_cuda.so (libtorch_hip.so in ROCm builds) registers the GPU backend from static
//! initialisers; nothing in the binary references its symbols, so a default `--as-needed`
//! link drops it and the GPU is then silently unavailable. We force it in with
//! `--no-as-needed`, and add an rpath to the libtorch folder so the binary runs from a
//! checkout without LD_LIBRARY_PATH.
//!
//! The shim gives Rust what libtorch offers only in C++ (custom autograd Functions for fp8
//! matmuls and the fused cross-entropy, whose CUDA kernels NVRTC compiles at run time, the
//! fused AdamW kernel, CUDA graphs, allocator statistics). It compiles against
//! the headers of the same torch wheel plus the CUDA runtime headers of the PyPI packages
//! nvidia-cuda-crt and nvidia-cuda-cccl (which land in site-packages/nvidia/cu13), and links
//! that wheel's CUDA runtime. The wheel is the CUDA build on CPU-only hosts too, so the shim
//! builds everywhere; the worker only calls into CUDA when a device is present.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc");
    // The runner-only build (`--no-default-features`) has no libtorch to link and no shim
    // to compile: nothing here is its business.
    if std::env::var_os("CARGO_FEATURE_BUILTIN").is_none() {
        return;
    }
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    let lib = PathBuf::from(lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    for backend in ["torch_cuda", "torch_hip"] {
        if lib.join(format!("lib{backend}.so")).exists() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-l{backend},--as-needed");
        }
    }
    build_shim(&lib);
}

fn build_shim(lib: &Path) {
    let torch = lib.parent().unwrap_or(lib);
    let include = torch.join("include");
    let cu13 = torch
        .parent()
        .map(|sp| sp.join("nvidia").join("cu13"))
        .unwrap_or_default();
    let cudart = cu13.join("lib").join("libcudart.so.13");
    if !include.join("ATen").exists() || !cu13.join("include").join("cuda_runtime_api.h").exists() {
        panic!(
            "the C++ shim needs torch headers in {} and CUDA runtime headers in {} \
             (pip install nvidia-cuda-crt==13.0.* nvidia-cuda-cccl==13.0.* into the venv)",
            include.display(),
            cu13.join("include").display()
        );
    }
    cc::Build::new()
        .cpp(true)
        .file("csrc/shim.cpp")
        .file("csrc/jit.cpp")
        .file("csrc/fused_ce.cpp")
        .file("csrc/fused_ln.cpp")
        .file("csrc/fused_gelu.cpp")
        .file("csrc/fused_rms.cpp")
        .file("csrc/fused_swiglu.cpp")
        .file("csrc/fused_adamw.cpp")
        .file("csrc/fused_linear.cpp")
        .file("csrc/fused_fp8.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(cu13.join("include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        // No debug info for the C++ shim, whatever the profile: with it, libtorch's headers
        // made the archive 90 MB, and every test binary that links the library carried
        // 60 MB of it, gigabytes in all, which filled a CI machine's disk mid-link.
        .debug(false)
        // libtorch's headers warn a lot under -Wall; they are not ours to fix.
        .warnings(false)
        .compile("bench_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!("cargo:rustc-link-lib=dylib=torch_cuda");
    // dlopen/dladdr for NVRTC (csrc/jit.cpp); part of libc from glibc 2.34, libdl before.
    println!("cargo:rustc-link-lib=dylib=dl");
    println!("cargo:rustc-link-arg={}", cudart.display());
    println!(
        "cargo:rustc-link-arg=-Wl,-rpath,{}",
        cu13.join("lib").display()
    );
}
