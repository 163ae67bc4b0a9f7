//! What can go wrong on the GPU path, typed the way the plugin host types its errors: one enum
//! with a [`GpuError::kind`] for callers that branch on the class of failure.

use cudarc::driver::DriverError;

/// The class of a [`GpuError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuErrorKind {
    /// No CUDA driver library on this machine (or no device behind it).
    NoDriver,
    /// No NVRTC library to compile the kernels with.
    NoCompiler,
    /// NVRTC refused the kernel source.
    Compile,
    /// The driver failed a call (allocation, copy, launch, synchronisation).
    Driver,
    /// A caller's shapes, indices or sizes do not fit (checked before any launch, since a bad
    /// index on the device reads or writes outside a buffer).
    InvalidArgument,
}

/// An error of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no CUDA driver: libcuda.so could not be loaded (is an NVIDIA driver installed, and its \
         library on the loader path?)"
    )]
    NoDriver,
    #[error("CUDA device {ordinal} is not available: {detail} ({count} device(s) found)")]
    NoDevice {
        ordinal: usize,
        count: i32,
        detail: String,
    },
    #[error(
        "no NVRTC: libnvrtc.so could not be loaded; the CUDA kernels are compiled at run time, \
         so put the CUDA toolkit's (or the nvidia-cuda-nvrtc wheel's) lib folder on LD_LIBRARY_PATH"
    )]
    NoCompiler,
    #[error("NVRTC could not compile the CUDA kernels: {log}")]
    Compile { log: String },
    #[error("CUDA driver call failed while {doing}: {source}")]
    Driver {
        doing: &'static str,
        #[source]
        source: DriverError,
    },
    #[error("invalid argument to a CUDA kernel: {0}")]
    InvalidArgument(String),
}

impl GpuError {
    pub fn kind(&self) -> GpuErrorKind {
        match self {
            GpuError::NoDriver | GpuError::NoDevice { .. } => GpuErrorKind::NoDriver,
            GpuError::NoCompiler => GpuErrorKind::NoCompiler,
            GpuError::Compile { .. } => GpuErrorKind::Compile,
            GpuError::Driver { .. } => GpuErrorKind::Driver,
            GpuError::InvalidArgument(_) => GpuErrorKind::InvalidArgument,
        }
    }

    /// Whether the error says this machine has no usable GPU (driver, device or compiler
    /// missing), as opposed to a fault of the kernels or the caller: tests skip on these.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self.kind(),
            GpuErrorKind::NoDriver | GpuErrorKind::NoCompiler
        )
    }
}

/// Attaches what was being done to a driver error.
pub(crate) trait DriverContext<T> {
    fn doing(self, doing: &'static str) -> Result<T, GpuError>;
}

impl<T> DriverContext<T> for Result<T, DriverError> {
    fn doing(self, doing: &'static str) -> Result<T, GpuError> {
        self.map_err(|source| GpuError::Driver { doing, source })
    }
}

/// Fails with [`GpuError::InvalidArgument`] unless `condition` holds.
pub(crate) fn ensure(condition: bool, what: impl FnOnce() -> String) -> Result<(), GpuError> {
    if condition {
        Ok(())
    } else {
        Err(GpuError::InvalidArgument(what()))
    }
}
