//! The launch contract: where this rank stands in the world, from the variables torchrun
//! sets (and `bench`'s launchers set the same way).

use super::error::RendezvousError;

/// The variables of the launch contract, as torchrun sets them.
pub const ENV_VARS: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// Where this rank stands in the world, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    pub master_addr: String,
    pub master_port: u16,
}

impl DistEnv {
    /// Reads the contract from the process environment; `Ok(None)` when neither `RANK`
    /// nor `WORLD_SIZE` is set (a plain single-process run).
    pub fn from_env() -> Result<Option<DistEnv>, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`DistEnv::from_env`], reading variables through `get` (for tests). `LOCAL_RANK`
    /// defaults to `RANK` and `LOCAL_WORLD_SIZE` to `WORLD_SIZE` (one host);
    /// `MASTER_ADDR` defaults to 127.0.0.1 when the world has one rank.
    pub(crate) fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<DistEnv>, RendezvousError> {
        if get("RANK").is_none() && get("WORLD_SIZE").is_none() {
            return Ok(None);
        }
        let num = |var: &'static str, default: Option<u32>| -> Result<u32, RendezvousError> {
            match get(var) {
                Some(v) => v.trim().parse::<u32>().map_err(|e| RendezvousError::Env {
                    var,
                    value: v.clone(),
                    reason: e.to_string(),
                }),
                None => default.ok_or(RendezvousError::Env {
                    var,
                    value: String::new(),
                    reason: "not set".into(),
                }),
            }
        };
        let rank = num("RANK", None)?;
        let world_size = num("WORLD_SIZE", None)?;
        let local_rank = num("LOCAL_RANK", Some(rank))?;
        let local_world_size = num("LOCAL_WORLD_SIZE", Some(world_size))?;
        if world_size == 0 || rank >= world_size {
            return Err(RendezvousError::Env {
                var: "RANK",
                value: rank.to_string(),
                reason: format!("must be below WORLD_SIZE={world_size}"),
            });
        }
        if local_world_size == 0 || local_rank >= local_world_size {
            return Err(RendezvousError::Env {
                var: "LOCAL_RANK",
                value: local_rank.to_string(),
                reason: format!("must be below LOCAL_WORLD_SIZE={local_world_size}"),
            });
        }
        let master_addr = match get("MASTER_ADDR") {
            Some(a) if !a.trim().is_empty() => a.trim().to_string(),
            _ if world_size == 1 => "127.0.0.1".to_string(),
            _ => {
                return Err(RendezvousError::Env {
                    var: "MASTER_ADDR",
                    value: String::new(),
                    reason: "not set".into(),
                })
            }
        };
        let master_port = match get("MASTER_PORT") {
            Some(p) => p.trim().parse::<u16>().map_err(|e| RendezvousError::Env {
                var: "MASTER_PORT",
                value: p.clone(),
                reason: e.to_string(),
            })?,
            None if world_size == 1 => 0,
            None => {
                return Err(RendezvousError::Env {
                    var: "MASTER_PORT",
                    value: String::new(),
                    reason: "not set".into(),
                })
            }
        };
        Ok(Some(DistEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
        }))
    }

    /// The contract as `(name, value)` pairs, for a child's environment.
    #[cfg(test)]
    pub(crate) fn to_env(&self) -> Vec<(String, String)> {
        let v = [
            self.rank.to_string(),
            self.world_size.to_string(),
            self.local_rank.to_string(),
            self.local_world_size.to_string(),
            self.master_addr.clone(),
            self.master_port.to_string(),
        ];
        ENV_VARS
            .iter()
            .zip(v)
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    pub(super) fn endpoint(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}
