//! Where a session runs: the CPU, or a CUDA device. Which one to use by default, and whether
//! a model can run on CUDA, are the backends' business ([`crate::backend::device_for`]).

/// The device a session runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU executor (bit-exact with llama.cpp's CPU build).
    #[default]
    Cpu,
    /// CUDA device with this ordinal (needs a build with the `cuda` feature).
    Cuda(usize),
}

impl Device {
    /// Parses `cpu`, `cuda` (device 0) or `cuda:N`.
    pub fn parse(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(format!("unknown device {s:?}: use cpu, cuda or cuda:N")),
            },
        }
    }

    /// `cpu` or `cuda:N`.
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Cuda(n) => format!("cuda:{n}"),
        }
    }

    /// True for a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(Device::parse("cpu"), Ok(Device::Cpu));
        assert_eq!(Device::parse("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(Device::parse("cuda:3"), Ok(Device::Cuda(3)));
        assert!(Device::parse("cuda:x").is_err());
        assert!(Device::parse("gpu").is_err());
        assert_eq!(Device::Cuda(1).name(), "cuda:1");
    }
}
