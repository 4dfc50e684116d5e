//! Why a worker failed: [`WorkerError`], each kind mapped to an [`ErrorKind`] and its exit
//! code, and the classification of libtorch's error messages. Every stage of the worker
//! returns it and the worker's entry point reports it, so it lives apart from the entry
//! point, in a file the stages import without importing the entry point back.

use crate::events::ErrorKind;

use super::data::DataError;

/// Why a worker failed; each maps to an [`ErrorKind`] and its exit code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WorkerError {
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("out of device memory: {0}")]
    Oom(String),
    #[error("loss is {value} at step {step}")]
    NanLoss { step: u64, value: f64 },
    #[error("{0}")]
    Internal(String),
    /// A rendezvous or NCCL failure of a multi-rank run.
    #[error("{0}")]
    Distributed(String),
    #[error(transparent)]
    Data(#[from] DataError),
}

impl WorkerError {
    pub(crate) fn kind(&self) -> ErrorKind {
        match self {
            WorkerError::BadInput(_) | WorkerError::Data(_) => ErrorKind::BadInput,
            WorkerError::Unsupported(_) => ErrorKind::Unsupported,
            WorkerError::Oom(_) => ErrorKind::Oom,
            WorkerError::NanLoss { .. } => ErrorKind::NanLoss,
            WorkerError::Internal(_) => ErrorKind::Internal,
            WorkerError::Distributed(_) => ErrorKind::Distributed,
        }
    }

    /// Classifies a libtorch / CUDA error message: out-of-memory is its own failure class.
    pub(crate) fn from_device(msg: String) -> WorkerError {
        if is_oom(&msg) {
            WorkerError::Oom(first_line(&msg))
        } else {
            WorkerError::Internal(msg)
        }
    }
}

fn is_oom(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    m.contains("out of memory") || m.contains("cudaerrormemoryallocation")
}

fn first_line(msg: &str) -> String {
    msg.lines().next().unwrap_or("").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_errors_are_classified() {
        let oom = WorkerError::from_device(
            "CUDA out of memory. Tried to allocate 2.00 GiB\nException raised from malloc".into(),
        );
        assert_eq!(oom.kind(), ErrorKind::Oom);
        assert_eq!(
            oom.to_string(),
            "out of device memory: CUDA out of memory. Tried to allocate 2.00 GiB"
        );
        assert_eq!(
            WorkerError::from_device("cudaErrorMemoryAllocation".into()).kind(),
            ErrorKind::Oom
        );
        assert_eq!(
            WorkerError::from_device("shape mismatch".into()).kind(),
            ErrorKind::Internal
        );
        assert_eq!(ErrorKind::Oom.exit_code(), crate::exit::worker::OOM);
    }
}
