//! Environment capture: what a run ran on, captured once per run, and the hardware key
//! that selects the baseline file (`h100-sxm-80gb`, `h200-141gb`, `mi300x-192gb`,
//! `cpu-x86_64`).
//!
//! Every probe is best-effort: a missing tool (no `nvidia-smi`, no git) leaves its field
//! empty instead of failing the run. The parsers are separate pure functions so they are
//! tested against captured tool output. Also the `bench env` command.

use std::path::{Path, PathBuf};

use crate::error::CliError;
use crate::format::Format;
use crate::results::Environment;

/// Which GPU stack a host has; it decides the device-selection variable for workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vendor {
    Nvidia,
    Amd,
}

impl Vendor {
    /// The variable that restricts a worker to its GPU slots.
    pub(crate) fn visible_devices_var(self) -> &'static str {
        match self {
            Vendor::Nvidia => "CUDA_VISIBLE_DEVICES",
            Vendor::Amd => "HIP_VISIBLE_DEVICES",
        }
    }
}

/// One GPU as the vendor tool reports it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Gpu {
    pub name: String,
    pub memory_mib: Option<u64>,
    pub driver: Option<String>,
}

/// The GPUs this host offers to the runner.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct GpuInventory {
    pub vendor: Option<Vendor>,
    pub gpus: Vec<Gpu>,
    /// Device ids workers may use, in the numbering of the visible-devices variable
    /// (e.g. `["0","1"]`, or `["2","3"]` when the runner itself was restricted to those).
    pub ids: Vec<String>,
    /// The driver's CUDA version (nvidia-smi header) or the ROCm version.
    pub stack_version: Option<String>,
}

impl GpuInventory {
    /// Probes `nvidia-smi`, then `rocm-smi`; an empty inventory when neither answers.
    /// A visible-devices variable already set for `bench` narrows the ids to its list.
    /// Each call is bounded ([`crate::proc::Tool`]: 10 s, 8 MiB of output), so a hung or
    /// flooding driver tool costs at most its time limit and a warning, never a hang.
    pub(crate) fn detect() -> GpuInventory {
        let mut inv = if let Some(out) = run_tool(
            "nvidia-smi",
            &[
                "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader,nounits",
            ],
        ) {
            let gpus = parse_nvidia_query(&out);
            let stack_version = run_tool("nvidia-smi", &[]).and_then(|h| parse_cuda_header(&h));
            GpuInventory {
                vendor: Some(Vendor::Nvidia),
                ids: (0..gpus.len()).map(|i| i.to_string()).collect(),
                gpus,
                stack_version,
            }
        } else if let Some(out) = run_tool(
            "rocm-smi",
            &["--showproductname", "--showmeminfo", "vram", "--csv"],
        ) {
            let gpus = parse_rocm_csv(&out);
            GpuInventory {
                vendor: Some(Vendor::Amd),
                ids: (0..gpus.len()).map(|i| i.to_string()).collect(),
                gpus,
                stack_version: std::fs::read_to_string("/opt/rocm/.info/version")
                    .ok()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
            }
        } else {
            GpuInventory::default()
        };
        if let Some(v) = inv.vendor {
            if let Ok(list) = std::env::var(v.visible_devices_var()) {
                let ids: Vec<String> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                inv.ids = ids;
            }
        }
        inv
    }

    /// The inventory restricted to (or, on a host whose tools do not answer, forced to)
    /// `n` GPUs, as `--gpus N` asks.
    pub(crate) fn with_count(mut self, n: u32) -> GpuInventory {
        let n = n as usize;
        if n == 0 {
            self.ids.clear();
            return self;
        }
        if self.ids.len() >= n {
            self.ids.truncate(n);
        } else {
            // The user says there are more GPUs than the tools showed (or no tool is
            // installed); trust them and number the extra devices after the known ones.
            let start = self.ids.len();
            self.ids.extend((start..n).map(|i| i.to_string()));
            self.vendor.get_or_insert(Vendor::Nvidia);
        }
        self
    }
}

/// Runs a probe tool through the bounded runner; its stdout when it exists and exits 0
/// within its limits. A tool that hangs or floods is worth a warning (the host's GPUs go
/// undetected); a missing or failing one is the usual CPU host and says nothing.
fn run_tool(program: &str, args: &[&str]) -> Option<String> {
    use crate::proc::ToolError;
    match crate::proc::Tool::new(program).args(args).stdout(None) {
        Ok(out) => Some(out),
        Err(e @ (ToolError::TimedOut { .. } | ToolError::TooMuchOutput { .. })) => {
            eprintln!("warning: GPU detection: {e}; no GPUs of it are used");
            None
        }
        Err(_) => None,
    }
}

/// Parses `nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits`.
pub(crate) fn parse_nvidia_query(out: &str) -> Vec<Gpu> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            Gpu {
                name: f.first().copied().unwrap_or("").to_string(),
                memory_mib: f.get(1).and_then(|m| m.parse().ok()),
                driver: f.get(2).map(|d| d.to_string()).filter(|d| !d.is_empty()),
            }
        })
        .collect()
}

/// Parses the `CUDA Version: 12.4` field of the plain `nvidia-smi` header.
pub(crate) fn parse_cuda_header(out: &str) -> Option<String> {
    let i = out.find("CUDA Version:")?;
    out[i + "CUDA Version:".len()..]
        .split_whitespace()
        .next()
        .map(String::from)
}

/// Parses `rocm-smi --showproductname --showmeminfo vram --csv`: a header row naming the
/// columns, then one row per card.
pub(crate) fn parse_rocm_csv(out: &str) -> Vec<Gpu> {
    let mut lines = out
        .lines()
        .filter(|l| l.starts_with("device") || l.starts_with("card"));
    let Some(header) = lines.next() else {
        return vec![];
    };
    let cols: Vec<&str> = header.split(',').collect();
    let col = |name: &str| cols.iter().position(|c| c.trim() == name);
    let (series, total) = (col("Card Series"), col("VRAM Total Memory (B)"));
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Gpu {
                name: series
                    .and_then(|i| f.get(i))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
                memory_mib: total
                    .and_then(|i| f.get(i))
                    .and_then(|b| b.trim().parse::<u64>().ok())
                    .map(|b| b / (1024 * 1024)),
                driver: None,
            }
        })
        .collect()
}

/// The baseline key of a GPU: model, form factor when the name gives one, memory in GB,
/// e.g. `NVIDIA H100 80GB HBM3` -> `h100-sxm-80gb`, `NVIDIA H200` with 143771 MiB ->
/// `h200-141gb`, `AMD Instinct MI300X` with 196592 MiB -> `mi300x-192gb`.
///
/// Memory comes from an `NNGB` token in the name when there is one (the marketed size);
/// otherwise it is the reported MiB rounded up to whole GiB, which gives the marketed
/// figure for the HBM parts this tool targets (80, 141, 192).
pub(crate) fn gpu_hardware_key(name: &str, memory_mib: Option<u64>) -> String {
    let lower = name.to_ascii_lowercase();
    let tokens: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .filter(|t| {
            !matches!(
                *t,
                "nvidia" | "amd" | "instinct" | "tesla" | "geforce" | "radeon"
            )
        })
        .collect();
    let is_mem = |t: &str| t.ends_with("gb") && t[..t.len() - 2].parse::<u32>().is_ok();
    let model = tokens
        .iter()
        .find(|t| {
            !is_mem(t)
                && t.chars().any(|c| c.is_ascii_digit())
                && t.chars().any(|c| c.is_ascii_alphabetic())
        })
        .or(tokens.first())
        .copied()
        .unwrap_or("gpu");
    let form = if tokens.iter().any(|t| t.starts_with("sxm")) {
        Some("sxm")
    } else if tokens.contains(&"pcie") {
        Some("pcie")
    } else if tokens.contains(&"nvl") {
        Some("nvl")
    } else if model == "h100" && tokens.iter().any(|t| t.starts_with("hbm")) {
        // The SXM H100 reports itself as "H100 80GB HBM3"; the PCIe one says PCIe.
        Some("sxm")
    } else {
        None
    };
    let mem_gb = tokens
        .iter()
        .find(|t| is_mem(t))
        .map(|t| t[..t.len() - 2].to_string())
        .or_else(|| memory_mib.map(|m| m.div_ceil(1024).to_string()));
    let mut parts = vec![model.to_string()];
    parts.extend(form.map(String::from));
    parts.extend(mem_gb.map(|g| format!("{g}gb")));
    parts.join("-")
}

/// The hardware key of a host: its first GPU's key, or `cpu-<arch>` without GPUs.
pub(crate) fn hardware_key(inv: &GpuInventory) -> String {
    match inv.gpus.first() {
        Some(g) if !inv.ids.is_empty() => gpu_hardware_key(&g.name, g.memory_mib),
        _ => format!("cpu-{}", std::env::consts::ARCH),
    }
}

/// Versions of the libtorch this process loaded, read from the torch wheel it came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TorchVersions {
    pub torch: Option<String>,
    pub cuda: Option<String>,
    pub hip: Option<String>,
    pub nccl: Option<String>,
}

/// Finds the loaded `libtorch_cpu.so` in /proc/self/maps (so the answer is the library
/// actually in use, wherever it came from) and reads the wheel's `torch/version.py` (or a
/// standalone archive's `build-version`) and the NCCL wheel's metadata beside it.
pub(crate) fn torch_versions() -> TorchVersions {
    let Some(lib) = loaded_library("libtorch_cpu") else {
        return TorchVersions::default();
    };
    // <site-packages>/torch/lib/libtorch_cpu.so
    let torch_dir = lib.parent().and_then(Path::parent);
    let mut v = torch_dir
        .and_then(|d| std::fs::read_to_string(d.join("version.py")).ok())
        .map(|t| parse_torch_version_py(&t))
        .unwrap_or_default();
    if v.torch.is_none() {
        // A standalone libtorch archive has `build-version` beside its lib/ instead.
        v.torch = torch_dir
            .and_then(|d| std::fs::read_to_string(d.join("build-version")).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
    }
    if let Some(site) = torch_dir.and_then(Path::parent) {
        v.nccl = nccl_wheel_version(site);
    }
    v
}

fn loaded_library(stem: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(stem))
        })
        .map(PathBuf::from)
}

/// Parses `__version__ = '2.11.0+cu128'`, `cuda = '12.8'`, `hip = None` from version.py.
pub(crate) fn parse_torch_version_py(text: &str) -> TorchVersions {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            // Annotated assignments (`cuda: Optional[str] = '13.0'`) name the key first.
            if k.split(':').next().map(str::trim) != Some(key) {
                return None;
            }
            let v = v.trim().trim_matches(|c| c == '\'' || c == '"');
            (v != "None" && !v.is_empty()).then(|| v.to_string())
        })
    };
    TorchVersions {
        torch: field("__version__"),
        cuda: field("cuda"),
        hip: field("hip"),
        nccl: None,
    }
}

/// The version of the `nvidia-nccl-cu*` wheel installed beside torch, from its
/// `.dist-info` folder name.
fn nccl_wheel_version(site: &Path) -> Option<String> {
    std::fs::read_dir(site).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let rest = name.strip_prefix("nvidia_nccl_cu")?;
        let rest = rest.strip_suffix(".dist-info")?;
        rest.split_once('-').map(|(_, v)| v.to_string())
    })
}

/// The CPU model from /proc/cpuinfo, or the architecture when it does not say.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn os_description() -> String {
    let pretty = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_string())
            })
        });
    let kernel = nix::sys::utsname::uname()
        .ok()
        .map(|u| u.release().to_string_lossy().into_owned());
    match (pretty, kernel) {
        (Some(p), Some(k)) => format!("{p} (Linux {k})"),
        (Some(p), None) => p,
        (None, Some(k)) => format!("{} {k}", std::env::consts::OS),
        (None, None) => std::env::consts::OS.to_string(),
    }
}

/// The commit of the git work tree at `dir` and whether it has uncommitted changes.
pub(crate) fn git_state(dir: &Path) -> (Option<String>, bool) {
    let git = |args: &[&str]| {
        crate::proc::Tool::git()
            .arg("-C")
            .arg(dir)
            .args(args)
            .stdout(None)
            .ok()
            .map(|o| o.trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty());
    let dirty = commit.is_some()
        && git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    (commit, dirty)
}

/// The variable that names this host in the history in place of its hostname.
pub const HOST_VAR: &str = "BENCH_HOST";

/// The longest host name `BENCH_HOST` may give.
const MAX_HOST_LEN: usize = 128;

/// Why `BENCH_HOST` cannot name a host (`None`: it is unset or can). A pool whose machines
/// share one hostname (lent VMs all called `vm`, job containers named by a fresh id each
/// time) gives each runner its own name there, so that the history's and the site's hosts
/// of a hardware key are the machines, not one name for all of them.
pub fn check_host_override() -> Option<String> {
    let v = std::env::var_os(HOST_VAR)?;
    let Some(v) = v.to_str() else {
        return Some(format!("{HOST_VAR} is not UTF-8"));
    };
    let ok = !v.is_empty()
        && v.len() <= MAX_HOST_LEN
        && !v.chars().any(|c| c.is_control() || c.is_whitespace());
    (!ok).then(|| {
        let cut: String = v.chars().take(MAX_HOST_LEN + 1).collect();
        format!(
            "{HOST_VAR}=\"{}\": a host name is 1 to {MAX_HOST_LEN} characters, none of them a space or a control character",
            crate::sanitize::inline(&cut)
        )
    })
}

/// The name the history records this host under: `BENCH_HOST` when it is set and valid
/// ([`check_host_override`], which `bench matrix` applies before anything runs), else the
/// hostname.
fn host_name() -> String {
    if let (Some(v), None) = (std::env::var_os(HOST_VAR), check_host_override()) {
        return v.to_string_lossy().into_owned();
    }
    nix::unistd::gethostname()
        .ok()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Captures the environment of this host, with `inv` as the GPUs the run uses.
pub(crate) fn capture(inv: &GpuInventory) -> Environment {
    let torch = torch_versions();
    let first = inv.gpus.first().filter(|_| !inv.ids.is_empty());
    let (git_commit, git_dirty) = git_state(Path::new("."));
    let nvidia = inv.vendor == Some(Vendor::Nvidia);
    Environment {
        gpu_model: first.map(|g| g.name.clone()).filter(|n| !n.is_empty()),
        gpu_count: inv.ids.len() as u32,
        gpu_memory_mib: first.and_then(|g| g.memory_mib),
        driver: first.and_then(|g| g.driver.clone()),
        // The CUDA libtorch was built with is what workers use; the driver's supported
        // version is the fallback when no torch wheel is found.
        cuda: torch
            .cuda
            .or_else(|| nvidia.then(|| inv.stack_version.clone()).flatten()),
        rocm: torch.hip.or_else(|| {
            (inv.vendor == Some(Vendor::Amd))
                .then(|| inv.stack_version.clone())
                .flatten()
        }),
        libtorch: torch.torch,
        nccl: torch.nccl,
        cpu: cpu_model(),
        host: host_name(),
        os: os_description(),
        git_commit,
        git_dirty,
        bench_version: env!("CARGO_PKG_VERSION").to_string(),
        hardware_key: hardware_key(inv),
        switches: speed_switches(std::env::vars()),
    }
}

/// Environment variables that change how fast a training step runs, recorded in every run:
/// the workload's kernel, fp8 and update switches ([`WORKLOAD_SWITCHES`], `BENCH_CPU_THREADS`), NCCL's tuning
/// (`NCCL_*`), the CUDA caching allocator and launch settings, TF32 overrides and the CPU
/// thread count. Prefixes end in `_`; other entries are whole names.
pub(crate) const SPEED_SWITCHES: &[&str] = &[
    "BENCH_FUSED_",
    "BENCH_FP8_",
    "BENCH_OVERLAP_ADAMW",
    "BENCH_CPU_THREADS",
    "NCCL_",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_NUM_THREADS",
];

/// The built-in workload's own switches among [`SPEED_SWITCHES`]: its fused kernels, fp8
/// recipe (`BENCH_FP8_HEAD`, `BENCH_FP8_SCALING`) and overlapped update. A run with any of
/// them set is not a clean run of the default code (the history's pools keep it apart).
pub(crate) const WORKLOAD_SWITCHES: &[&str] =
    &["BENCH_FUSED_", "BENCH_FP8_", "BENCH_OVERLAP_ADAMW"];

/// Whether `name` matches one of `patterns` (a prefix when it ends in `_`, else whole).
pub(crate) fn matches_switch(patterns: &[&str], name: &str) -> bool {
    patterns.iter().any(|p| {
        if p.ends_with('_') {
            name.starts_with(p)
        } else {
            name == *p
        }
    })
}

/// The speed-changing variables among `vars` (see [`SPEED_SWITCHES`]), sorted by name so
/// two runs with the same settings record the same map.
pub(crate) fn speed_switches(
    vars: impl Iterator<Item = (String, String)>,
) -> indexmap::IndexMap<String, String> {
    let mut found: Vec<(String, String)> = vars
        .filter(|(k, _)| matches_switch(SPEED_SWITCHES, k))
        .collect();
    found.sort();
    found.into_iter().collect()
}

/// Resolved settings of `bench env`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EnvSettings {
    /// Terminal output format.
    pub format: Format,
}

/// `bench env [--format json]`.
pub(crate) fn cmd(args: &EnvSettings) -> Result<i32, CliError> {
    let env = capture(&GpuInventory::detect());
    match args.format {
        Format::Json => {
            let text = serde_json::to_string_pretty(&env)
                .map_err(|e| CliError::internal(miette::miette!("cannot encode: {e}")))?;
            println!("{text}");
        }
        Format::Human => {
            let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
            println!("hardware key  {}", env.hardware_key);
            println!(
                "gpu           {} x {}{}",
                env.gpu_count,
                opt(&env.gpu_model),
                env.gpu_memory_mib
                    .map(|m| format!(" ({m} MiB)"))
                    .unwrap_or_default()
            );
            println!("driver        {}", opt(&env.driver));
            println!("cuda          {}", opt(&env.cuda));
            println!("rocm          {}", opt(&env.rocm));
            println!("libtorch      {}", opt(&env.libtorch));
            println!("nccl          {}", opt(&env.nccl));
            println!("cpu           {}", env.cpu);
            println!("host          {}", env.host);
            println!("os            {}", env.os);
            println!(
                "git           {}{}",
                opt(&env.git_commit),
                if env.git_dirty { " (dirty)" } else { "" }
            );
            println!("bench         {}", env.bench_version);
        }
    }
    Ok(crate::exit::bench::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_switches_keep_only_the_variables_that_change_speed_sorted() {
        let vars = [
            ("PATH", "/bin"),
            ("BENCH_FUSED_RMS", "0"),
            ("NCCL_ALGO", "Ring"),
            ("BENCH_FUSED_ADAMW", "0"),
            ("BENCH_OVERLAP_ADAMW", "1"),
            ("BENCH_OVERLAP_ADAMWX", "1"),
            ("OMP_NUM_THREADS", "8"),
            ("OMP_NUM_THREADSX", "8"),
            ("GITHUB_TOKEN", "secret"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let got = speed_switches(vars.into_iter());
        let keys: Vec<&str> = got.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "BENCH_FUSED_ADAMW",
                "BENCH_FUSED_RMS",
                "BENCH_OVERLAP_ADAMW",
                "NCCL_ALGO",
                "OMP_NUM_THREADS"
            ]
        );
        assert_eq!(got["BENCH_FUSED_ADAMW"], "0");
    }

    #[test]
    fn hardware_keys_of_known_parts() {
        assert_eq!(
            gpu_hardware_key("NVIDIA H100 80GB HBM3", Some(81559)),
            "h100-sxm-80gb"
        );
        assert_eq!(gpu_hardware_key("NVIDIA H200", Some(143771)), "h200-141gb");
        assert_eq!(
            gpu_hardware_key("AMD Instinct MI300X", Some(196592)),
            "mi300x-192gb"
        );
        assert_eq!(
            gpu_hardware_key("NVIDIA A100-SXM4-40GB", Some(40960)),
            "a100-sxm-40gb"
        );
        assert_eq!(
            gpu_hardware_key("NVIDIA H100 PCIe", Some(81559)),
            "h100-pcie-80gb"
        );
        assert_eq!(
            hardware_key(&GpuInventory::default()),
            format!("cpu-{}", std::env::consts::ARCH)
        );
    }

    #[test]
    fn parses_nvidia_smi_query_and_header() {
        let out =
            "NVIDIA H100 80GB HBM3, 81559, 550.54.15\nNVIDIA H100 80GB HBM3, 81559, 550.54.15\n";
        let gpus = parse_nvidia_query(out);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].memory_mib, Some(81559));
        assert_eq!(gpus[0].driver.as_deref(), Some("550.54.15"));
        let header =
            "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |";
        assert_eq!(parse_cuda_header(header).as_deref(), Some("12.4"));
    }

    #[test]
    fn parses_rocm_smi_csv() {
        let out =
            "device,Card Series,Card Model,VRAM Total Memory (B),VRAM Total Used Memory (B)\n\
                   card0,AMD Instinct MI300X,0x74a1,206141652992,295567360\n";
        let gpus = parse_rocm_csv(out);
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].name, "AMD Instinct MI300X");
        assert_eq!(
            gpu_hardware_key(&gpus[0].name, gpus[0].memory_mib),
            "mi300x-192gb"
        );
    }

    #[test]
    fn parses_torch_version_py() {
        let v = parse_torch_version_py(
            "__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n",
        );
        assert_eq!(v.torch.as_deref(), Some("2.11.0+cu130"));
        assert_eq!(v.cuda.as_deref(), Some("13.0"));
        assert_eq!(v.hip, None);
    }

    #[test]
    fn forced_gpu_count_numbers_devices() {
        let inv = GpuInventory::default().with_count(2);
        assert_eq!(inv.ids, vec!["0", "1"]);
        assert_eq!(inv.vendor, Some(Vendor::Nvidia));
        assert!(GpuInventory::default().with_count(0).ids.is_empty());
    }
}
