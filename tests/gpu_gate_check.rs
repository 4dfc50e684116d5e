//! The GPU tests' gate (tests/gpu_gate) on any host: asked for more CUDA devices than any
//! host has, it skips without `BENCH_GPU_TESTS`, and fails with it, so that a GPU runner that
//! lost CUDA cannot report the GPU tests green.
// It asks libtorch for the CUDA devices: the default build (Cargo feature `builtin`) only.
#![cfg(feature = "builtin")]

mod gpu_gate;

#[test]
fn missing_devices_skip_unless_the_gpu_tests_are_required() {
    // One test only in this binary: it owns the process environment.
    std::env::remove_var("BENCH_GPU_TESTS");
    assert!(!gpu_gate::cuda_devices(i64::MAX, "the gate check"));
    std::env::set_var("BENCH_GPU_TESTS", "1");
    let failed = std::panic::catch_unwind(|| gpu_gate::cuda_devices(i64::MAX, "the gate check"));
    std::env::remove_var("BENCH_GPU_TESTS");
    let msg = failed.expect_err("a required GPU test must fail without its devices");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("BENCH_GPU_TESTS=1 but"), "{msg}");
}
