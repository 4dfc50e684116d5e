//! The device a worker runs on: parsing `--device`, its name, capability checks,
//! synchronisation and peak-memory statistics. CUDA is touched only when present.

use tch::{Cuda, Device};

use super::error::WorkerError;
use super::ffi;

/// A resolved device.
#[derive(Debug, Clone)]
pub(crate) struct DeviceInfo {
    pub device: Device,
    /// E.g. "NVIDIA H100 80GB HBM3" or "cpu".
    pub name: String,
}

/// CPU cells train on one thread unless `BENCH_CPU_THREADS` says otherwise.
///
/// libtorch's default is one OpenMP thread per core, whose workers spin while they wait.
/// On a machine shared with other work (a CI runner, several cells side by side) that made
/// two identical smoke runs of the tiny presets differ by up to 28x; one thread measures the
/// workload rather than the scheduler. CPU cells exist to prove the pipeline, not to rank
/// CPUs, so stability wins over speed here.
fn set_cpu_threads() -> Result<(), WorkerError> {
    let threads = match std::env::var("BENCH_CPU_THREADS") {
        Ok(v) => v
            .trim()
            .parse::<i32>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                WorkerError::BadInput(format!(
                    "BENCH_CPU_THREADS={v:?}: expected a number of threads, at least 1"
                ))
            })?,
        Err(_) => 1,
    };
    tch::set_num_threads(threads);
    Ok(())
}

impl DeviceInfo {
    /// Resolves `cpu`, `cuda`, `cuda:N` or `auto` to a device of this host.
    pub(crate) fn resolve(spec: crate::axes::Device) -> Result<DeviceInfo, WorkerError> {
        use crate::axes::Device as Spec;
        let device = match spec {
            Spec::Cpu => Device::Cpu,
            Spec::Auto => {
                if Cuda::is_available() {
                    Device::Cuda(0)
                } else {
                    Device::Cpu
                }
            }
            Spec::Cuda(i) => Device::Cuda(i.unwrap_or(0)),
        };
        if let Device::Cuda(i) = device {
            let count = Cuda::device_count();
            if !Cuda::is_available() || i as i64 >= count {
                return Err(WorkerError::Unsupported(format!(
                    "--device {spec}: no such CUDA device ({count} visible)"
                )));
            }
        }
        let name = match device {
            Device::Cuda(i) => ffi::cuda_device_name(i as i64).map_err(WorkerError::Internal)?,
            _ => {
                set_cpu_threads()?;
                "cpu".to_string()
            }
        };
        Ok(DeviceInfo { device, name })
    }

    pub(crate) fn is_cuda(&self) -> bool {
        matches!(self.device, Device::Cuda(_))
    }

    fn index(&self) -> Option<i64> {
        match self.device {
            Device::Cuda(i) => Some(i as i64),
            _ => None,
        }
    }

    /// Whether the device runs fp8 matmuls (`_scaled_mm`): CUDA compute capability 8.9+.
    pub(crate) fn supports_fp8(&self) -> Result<bool, WorkerError> {
        match self.index() {
            Some(i) => {
                let (major, minor) = ffi::cuda_capability(i).map_err(WorkerError::Internal)?;
                Ok((major, minor) >= (8, 9))
            }
            None => Ok(false),
        }
    }

    /// Waits for all queued work (no-op on CPU, where ops are synchronous).
    pub(crate) fn synchronize(&self) -> Result<(), WorkerError> {
        match self.index() {
            Some(i) => ffi::cuda_synchronize(i).map_err(WorkerError::from_device),
            None => Ok(()),
        }
    }

    /// Peak bytes held by the CUDA caching allocator since the last reset; `None` on CPU.
    pub(crate) fn peak_memory(&self) -> Result<Option<u64>, WorkerError> {
        match self.index() {
            Some(i) => ffi::cuda_peak_allocated(i)
                .map(Some)
                .map_err(WorkerError::Internal),
            None => Ok(None),
        }
    }

    pub(crate) fn reset_peak_memory(&self) -> Result<(), WorkerError> {
        match self.index() {
            Some(i) => ffi::cuda_reset_peak(i).map_err(WorkerError::Internal),
            None => Ok(()),
        }
    }
}
