//! Which device a model runs on (`--device cpu|cuda[:N]`), and whether this build and machine
//! can run it there.
//!
//! The CPU runs everything, and so does a CUDA device. On CUDA, a build without the `cuda`
//! feature, a machine without a driver or without the device named, each gets an error that says
//! which ([`Device::check`]), before any weight is loaded.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A device to run a model on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Device {
    #[default]
    Cpu,
    /// The CUDA device of this ordinal (`cuda` is `cuda:0`).
    Cuda { ordinal: usize },
}

/// What kind of problem a [`DeviceError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceErrorKind {
    /// The text names no device.
    Parse,
    /// This build, or this machine, has no such device.
    Unavailable,
}

/// Why a device cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("`{given}` is not a device: write `cpu`, `cuda` or `cuda:N` (N the device's ordinal)")]
    Parse { given: String },
    #[error("{device}: this build has no CUDA backend (build with `--features cuda`)")]
    NotBuilt { device: Device },
    #[error("{device}: {detail}")]
    Unavailable { device: Device, detail: String },
}

impl DeviceError {
    pub fn kind(&self) -> DeviceErrorKind {
        match self {
            DeviceError::Parse { .. } => DeviceErrorKind::Parse,
            DeviceError::NotBuilt { .. } | DeviceError::Unavailable { .. } => {
                DeviceErrorKind::Unavailable
            }
        }
    }
}

impl Device {
    /// Whether this device can be used here. On CUDA it opens the device (the driver, the
    /// device itself, and NVRTC compiling the kernels), so a machine that lacks one of them says
    /// which.
    pub fn check(self) -> Result<(), DeviceError> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda { ordinal } => open_cuda(self, ordinal),
        }
    }
}

#[cfg(feature = "cuda")]
impl Device {
    /// Opens the CUDA device this names: the driver, the device, and NVRTC compiling the
    /// kernels, so that a machine lacking one says which. The CPU is no CUDA device.
    pub fn open_gpu(self) -> Result<opentinker_kernels::cuda::Gpu, DeviceError> {
        let Device::Cuda { ordinal } = self else {
            return Err(DeviceError::Unavailable {
                device: self,
                detail: "the CPU is not a CUDA device".into(),
            });
        };
        opentinker_kernels::cuda::Gpu::new(ordinal).map_err(|error| DeviceError::Unavailable {
            device: self,
            detail: error.to_string(),
        })
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(device: Device, _ordinal: usize) -> Result<(), DeviceError> {
    device.open_gpu().map(drop)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(device: Device, _ordinal: usize) -> Result<(), DeviceError> {
    Err(DeviceError::NotBuilt { device })
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl FromStr for Device {
    type Err = DeviceError;

    fn from_str(text: &str) -> Result<Self, DeviceError> {
        let parse = || DeviceError::Parse {
            given: text.to_string(),
        };
        match text.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda { ordinal: 0 }),
            other => {
                let ordinal = other.strip_prefix("cuda:").ok_or_else(parse)?;
                // Digits only: `cuda:+1` and `cuda: 1` are typos, not ordinals.
                if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(parse());
                }
                let ordinal = ordinal.parse().map_err(|_| parse())?;
                Ok(Device::Cuda { ordinal })
            }
        }
    }
}

impl TryFrom<String> for Device {
    type Error = DeviceError;

    fn try_from(text: String) -> Result<Self, DeviceError> {
        text.parse()
    }
}

impl From<Device> for String {
    fn from(device: Device) -> String {
        device.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print_as_written() {
        for (text, device) in [
            ("cpu", Device::Cpu),
            ("CPU", Device::Cpu),
            ("cuda", Device::Cuda { ordinal: 0 }),
            ("cuda:3", Device::Cuda { ordinal: 3 }),
        ] {
            assert_eq!(text.parse::<Device>().unwrap(), device, "{text}");
        }
        assert_eq!(Device::Cuda { ordinal: 3 }.to_string(), "cuda:3");
        for bad in [
            "gpu", "cuda:", "cuda:x", "cuda:+1", "cuda:-1", "", "cuda:1:2",
        ] {
            let error = bad.parse::<Device>().unwrap_err();
            assert_eq!(error.kind(), DeviceErrorKind::Parse, "{bad}");
            assert!(error.to_string().contains(&format!("`{bad}`")), "{error}");
        }
        let json = serde_json::to_string(&Device::Cuda { ordinal: 1 }).unwrap();
        assert_eq!(json, "\"cuda:1\"");
        assert_eq!(
            serde_json::from_str::<Device>(&json).unwrap(),
            Device::Cuda { ordinal: 1 }
        );
        assert!(serde_json::from_str::<Device>("\"tpu\"").is_err());
    }

    #[test]
    fn the_cpu_runs_everything() {
        assert!(Device::Cpu.check().is_ok());
    }
}
