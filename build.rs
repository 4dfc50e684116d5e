//! Link settings for libtorch.
//!
//! libtorch_cuda.so (libtorch_hip.so in ROCm builds) registers the GPU backend from static
//! initialisers; nothing in the binary references its symbols, so a default `--as-needed`
//! link drops it and the GPU is then silently unavailable. We force it in with
//! `--no-as-needed`, and add an rpath to the libtorch folder so the binary runs from a
//! checkout without LD_LIBRARY_PATH.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
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
}
