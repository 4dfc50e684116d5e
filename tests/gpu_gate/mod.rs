//! The gate of the GPU tests, as `BENCH_SLURM_TESTS` gates the Slurm tests: with
//! `BENCH_GPU_TESTS=1` (set by a GPU host's CI and by scripts/gpu-bench.sh and
//! scripts/gpu-dist-bench.sh) a host without the CUDA devices a test needs fails that test,
//! so a GPU runner that lost its driver or CUDA build reports red, not green. Unset, the
//! test is skipped with a message (the CPU CI has no GPU).

/// Whether `need` CUDA devices are visible; panics when they are not and
/// `BENCH_GPU_TESTS=1` says they must be.
pub fn cuda_devices(need: i64, what: &str) -> bool {
    let n = tch::Cuda::device_count();
    if n >= need {
        return true;
    }
    let required = std::env::var("BENCH_GPU_TESTS").as_deref() == Ok("1");
    assert!(
        !required,
        "BENCH_GPU_TESTS=1 but {n} CUDA device(s) are visible and {what} needs {need}: the driver, CUDA_VISIBLE_DEVICES or a CPU-only libtorch is to blame"
    );
    eprintln!(
        "skipping {what}: {n} CUDA device(s), {need} needed (BENCH_GPU_TESTS=1 makes this a failure)"
    );
    false
}
