//! Typed values of the well-known axes the built-in workload interprets: [`Dtype`],
//! [`Parallel`] and the worker's [`Device`].
//!
//! Matrix cells keep their axis values as written (ids, filters and command templates work
//! on the text), but everything that acts on these three reads them through these types:
//! matrix expansion refuses a value outside them with a located error (exit 2 at
//! `--dry-run`, before any cell runs), the cell hands them to the runner typed, and
//! `bench worker` parses its flags into them. Each type has exactly one default.

use std::fmt;
use std::str::FromStr;

use clap::ValueEnum;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The dtype a cell's matmuls run in (parameters and optimizer state stay fp32).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema, ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[serde(alias = "float32")]
    #[value(alias = "float32")]
    Fp32,
    /// The default of a cell without a `dtype` axis: what LLM training runs in.
    #[default]
    #[serde(alias = "bfloat16")]
    #[value(alias = "bfloat16")]
    Bf16,
    Fp8,
}

/// How the ranks of a cell share the work.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema, ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Parallel {
    /// One process; the default of a cell without a `parallel` axis.
    #[default]
    Single,
    /// Data parallel: every rank holds the whole model and all-reduces gradients.
    Ddp,
    /// Fully sharded data parallel: parameters, gradients and optimizer state sharded.
    Fsdp,
}

impl Dtype {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp8 => "fp8",
        }
    }
}

impl Parallel {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Parallel::Single => "single",
            Parallel::Ddp => "ddp",
            Parallel::Fsdp => "fsdp",
        }
    }

    /// Whether the built-in workload runs one rank per GPU of the cell (DDP, FSDP).
    pub(crate) fn is_multi_rank(self) -> bool {
        self != Parallel::Single
    }
}

/// Parses through clap's `ValueEnum` table, so the names and aliases the command line
/// accepts are exactly those the matrix accepts.
fn parse_value<T: ValueEnum>(s: &str, what: &str) -> Result<T, String> {
    T::from_str(s, false).map_err(|_| {
        let known: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!("`{s}` is not a {what} (known: {})", known.join(", "))
    })
}

impl FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_value(s, "dtype")
    }
}

impl FromStr for Parallel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_value(s, "parallel mode")
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Parallel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The device a worker trains on: `auto` (the default: CUDA when available, else the CPU),
/// `cpu`, `cuda` (the first visible GPU) or `cuda:N`.
///
/// Not a clap `ValueEnum` because `cuda:N` carries a number; it parses through [`FromStr`]
/// and (de)serializes as the same text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    #[default]
    Auto,
    Cpu,
    /// `cuda` (None) or `cuda:N`.
    Cuda(Option<usize>),
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(None)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(Device::Cuda(Some(i))),
                _ => Err(format!("`{s}` is not a device (cpu, cuda, cuda:N or auto)")),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(None) => f.write_str("cuda"),
            Device::Cuda(Some(i)) => write!(f, "cuda:{i}"),
        }
    }
}

impl Serialize for Device {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_round_trip() {
        for d in Dtype::value_variants() {
            assert_eq!(d.name().parse::<Dtype>(), Ok(*d));
            let json = serde_json::to_string(d).unwrap();
            assert_eq!(json, format!("\"{}\"", d.name()));
        }
        assert_eq!("bfloat16".parse::<Dtype>(), Ok(Dtype::Bf16));
        assert_eq!("float32".parse::<Dtype>(), Ok(Dtype::Fp32));
        let e = "fp16".parse::<Dtype>().unwrap_err();
        assert!(e.contains("fp32, bf16, fp8"), "{e}");
        for p in Parallel::value_variants() {
            assert_eq!(p.name().parse::<Parallel>(), Ok(*p));
        }
        assert!("tensor".parse::<Parallel>().is_err());
    }

    #[test]
    fn devices_parse_and_print_the_same_text() {
        for s in ["auto", "cpu", "cuda", "cuda:3"] {
            let d: Device = s.parse().unwrap();
            assert_eq!(d.to_string(), s);
            let back: Device = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
            assert_eq!(back, d);
        }
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("tpu".parse::<Device>().is_err());
    }
}
