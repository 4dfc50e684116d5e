//! The built-in workload's engine (Cargo feature `builtin`): the worker's settings checked
//! against the presets, the device, the model, the data, the loop and the summary, on
//! libtorch. `super::run_worker` calls [`run_training`]; libtorch's errors, which tch raises as
//! panics, are caught at its one boundary and classified.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crate::axes::{Device, Parallel};
use crate::events::Event;
use crate::metrics::flops;

use super::models::presets;
use super::settings::WorkerSettings;
use super::{
    data, device, dp, error, ffi, group, measure, models, optim, overlap, precision, train,
};
use data::{Batches, Source};
use device::DeviceInfo;
use error::WorkerError;
use precision::{Ctx, Precision};

use crate::dist::rendezvous::DistEnv;

/// Features the worker knows.
const FEATURES: [&str; 2] = ["compile", "sac"];

/// The worker's settings, checked and resolved.
pub(crate) struct Settings {
    pub cfg: presets::ModelConfig,
    pub precision: Precision,
    pub compile: bool,
    pub sac_every: Option<usize>,
    pub steps: u32,
    pub warmup: u32,
    pub seq_len: i64,
    pub micro_batch: i64,
    pub grad_accum: u32,
    /// `--parallel`: DDP and FSDP run one rank per GPU when the launch contract says
    /// WORLD_SIZE > 1, and their own schedule over one rank otherwise.
    pub parallel: Parallel,
}

impl Settings {
    pub(crate) fn resolve(a: &WorkerSettings) -> Result<Settings, WorkerError> {
        let cfg = presets::get(&a.model).ok_or_else(|| {
            let names: Vec<_> = presets::all().iter().map(|c| c.name).collect();
            WorkerError::BadInput(format!(
                "--model {:?}: unknown preset (known: {})",
                a.model,
                names.join(", ")
            ))
        })?;
        // `--dtype` and `--parallel` arrive typed: clap refused anything else (exit 2).
        let precision = a.dtype;
        let parallel = a.parallel;
        for f in &a.features {
            if !FEATURES.contains(&f.as_str()) {
                return Err(WorkerError::Unsupported(format!(
                    "--features {f}: unknown feature (known: {})",
                    FEATURES.join(", ")
                )));
            }
        }
        let has = |f: &str| a.features.iter().any(|x| x == f);
        if a.steps == 0 || a.warmup >= a.steps {
            return Err(WorkerError::BadInput(format!(
                "--steps {} --warmup {}: need more steps than warm-up steps",
                a.steps, a.warmup
            )));
        }
        if a.seq_len == 0 || a.micro_batch == 0 || a.grad_accum == 0 {
            return Err(WorkerError::BadInput(
                "--seq-len, --micro-batch and --grad-accum must be positive".into(),
            ));
        }
        if a.seq_len as i64 > cfg.max_seq {
            return Err(WorkerError::BadInput(format!(
                "--seq-len {}: {} accepts at most {}",
                a.seq_len, cfg.name, cfg.max_seq
            )));
        }
        let sac_every = if has("sac") {
            if a.sac_every == 0 {
                return Err(WorkerError::BadInput(
                    "--sac-every must be at least 1".into(),
                ));
            }
            Some(a.sac_every as usize)
        } else {
            None
        };
        Ok(Settings {
            cfg,
            precision,
            compile: has("compile"),
            sac_every,
            steps: a.steps,
            warmup: a.warmup,
            seq_len: a.seq_len as i64,
            micro_batch: a.micro_batch as i64,
            grad_accum: a.grad_accum,
            parallel,
        })
    }
}

fn emit(e: Event) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", e.to_line());
    let _ = out.flush();
}

/// The launch contract when this worker is one rank of several (`--parallel ddp|fsdp`
/// with WORLD_SIZE > 1). A DDP or FSDP worker started alone runs the same schedule over
/// one rank (no collectives; FSDP's units stay whole, there being nothing to shard), so a
/// one-GPU cell measures the schedule its many-GPU cells run.
fn dist_env(s: &Settings) -> Result<Option<DistEnv>, WorkerError> {
    if s.parallel == Parallel::Single {
        return Ok(None);
    }
    let env = DistEnv::from_env().map_err(|e| WorkerError::Distributed(e.to_string()))?;
    Ok(env.filter(|e| e.world_size > 1))
}

fn run(args: &WorkerSettings, started: Instant) -> Result<(), WorkerError> {
    let s = Settings::resolve(args)?;
    let denv = dist_env(&s)?;
    // A rank uses the GPU at LOCAL_RANK among those the launcher made visible.
    let device_spec = match (&denv, args.device) {
        (Some(e), Device::Auto | Device::Cuda(None)) => Device::Cuda(Some(e.local_rank as usize)),
        (_, d) => d,
    };
    let par = s.parallel.name();
    if denv.is_some() && !tch::Cuda::is_available() {
        return Err(WorkerError::Unsupported(format!(
            "--parallel {par}: needs one CUDA GPU per rank and NCCL; no CUDA device is visible"
        )));
    }
    let dev = DeviceInfo::resolve(device_spec)?;
    let group = match (&denv, dev.device) {
        (Some(e), tch::Device::Cuda(i)) => Some(group::Group::join(e.clone(), i as i64)?),
        (Some(_), _) => {
            return Err(WorkerError::Unsupported(format!(
                "--parallel {par}: needs one CUDA GPU per rank and NCCL; {} is not one",
                dev.name
            )))
        }
        (None, _) => None,
    };
    let result = train_on(args, &s, &dev, group.as_ref(), started);
    match (result, group) {
        (Err(e), Some(g)) => {
            g.report_failure(&e.to_string());
            Err(e)
        }
        (Ok(()), Some(g)) => g.finish(),
        (r, None) => r,
    }
}

/// Whether the fp32 masters live in flat buffers updated by the shim's master-weight
/// AdamW kernel, which writes the bf16 working copy in the same pass: on a GPU, computing
/// in bf16 (bf16 or fp8), unless `BENCH_FUSED_ADAMW=0` asks for libtorch's fused AdamW over
/// fp32 parameters (for A/B runs). The plain loop moves its parameters into such buffers
/// ([`optim::AdamW::with_masters`]); DDP and FSDP run the kernel over their own slices
/// ([`dp::Update::Kernel`]).
fn master_weights(s: &Settings, dev: &DeviceInfo) -> bool {
    dev.is_cuda()
        && s.precision.compute_kind() == tch::Kind::BFloat16
        && std::env::var("BENCH_FUSED_ADAMW").map_or(true, |v| v != "0")
}

fn train_on(
    args: &WorkerSettings,
    s: &Settings,
    dev: &DeviceInfo,
    group: Option<&group::Group>,
    started: Instant,
) -> Result<(), WorkerError> {
    let world = group.map_or(1, |g| g.world_size());
    let rank = group.map_or(0, |g| g.rank());
    // Only rank 0 reports; the other ranks' stdout stays free of events.
    let mut emit = |e: Event| {
        if rank == 0 {
            emit(e)
        }
    };
    if s.precision == Precision::Fp8 && !dev.supports_fp8()? {
        return Err(WorkerError::Unsupported(format!(
            "--dtype fp8: {} has no fp8 matmuls (needs a CUDA GPU of compute capability 8.9+)",
            dev.name
        )));
    }
    let data_parallel = s.parallel != Parallel::Single;
    let cuda_graph = s.compile && dev.is_cuda() && !data_parallel;
    if s.compile && dev.is_cuda() && data_parallel {
        emit(Event::Notice {
            message: format!(
                "compile: CUDA-graph capture is not used with {} (its collectives and block-by-block schedule run outside a graph); running eager steps with fused AdamW",
                s.parallel.name()
            ),
        });
    }
    if s.compile && !dev.is_cuda() {
        emit(Event::Notice {
            message: format!(
                "compile: {} has no CUDA graphs or fused kernels; running plain eager execution",
                dev.name
            ),
        });
    }
    let mut warmup = s.warmup;
    if cuda_graph && warmup < train::EAGER_BEFORE_CAPTURE {
        warmup = train::EAGER_BEFORE_CAPTURE.min(s.steps - 1);
        emit(Event::Notice {
            message: format!(
                "compile: warm-up raised from {} to {warmup} steps (eager steps before CUDA-graph capture)",
                s.warmup
            ),
        });
    }

    let source = match (&args.data, args.synthetic.as_str()) {
        (Some(path), _) => {
            Batches::read_file(path, args.data_bytes, s.cfg.vocab, s.seq_len as usize)?
        }
        (None, "random") => Source::Random,
        (None, "pattern") => Source::Pattern,
        (None, other) => {
            return Err(WorkerError::BadInput(format!(
                "--synthetic {other:?}: expected random or pattern"
            )))
        }
    };
    let data = Batches::new(
        source,
        args.seed,
        s.cfg.vocab,
        s.micro_batch as usize,
        s.seq_len as usize,
    );

    tch::manual_seed(args.seed as i64);
    dev.reset_peak_memory()?;
    let model = models::build(&s.cfg, s.seq_len, dev.device, s.precision.compute_kind());
    let overlap_switch = overlap::switch().map_err(WorkerError::BadInput)?;
    let mut dp_state: Option<dp::DataParallel> = None;
    // Said in the run's events after its start event.
    let mut notices: Vec<String> = Vec::new();
    let mut parallel_said = match s.parallel {
        Parallel::Single => "one device, no data parallelism".to_string(),
        Parallel::Ddp => format!(
            "DDP over {world} rank{}: bench's bucketed all-reduce, block by block",
            if world == 1 { "" } else { "s" }
        ),
        Parallel::Fsdp => format!(
            "FSDP over {world} ranks: each block's parameters sharded, all-gathered before use"
        ),
    };
    let parallel = match s.parallel {
        Parallel::Single => train::Parallel::Single,
        kind => {
            let comms = match group {
                Some(g) => dp::Comms::Nccl {
                    group: g,
                    stream: ffi::cuda_comm_stream(g.index).map_err(WorkerError::Internal)?,
                },
                None => dp::Comms::Local,
            };
            // FSDP over one rank has nothing to shard: its units stay whole, as DDP's do,
            // so no all-gather copies are made and held (torchtitan likewise applies no
            // FSDP at dp_shard 1). The block-by-block schedule, the flattened gradients
            // and the optimizer over the slices are the many-rank code's; the gathers and
            // releases run, and are tested on the CPU, wherever a rank holds a slice.
            let sharding = match (kind, group) {
                (Parallel::Fsdp, Some(_)) => dp::Sharding::Sharded,
                (Parallel::Fsdp, None) => {
                    parallel_said = "FSDP over 1 rank: units kept whole (nothing to shard); FSDP's schedule, reduction buffers and sliced optimizer".to_string();
                    notices.push("fsdp over one rank: nothing to shard, so the units stay whole (no all-gathers); the schedule, the gradients' reduction buffers and the optimizer over the slices are FSDP's".to_string());
                    dp::Sharding::Replicated
                }
                _ => dp::Sharding::Replicated,
            };
            let update = if master_weights(s, dev) {
                dp::Update::Kernel {
                    accumulate: s.grad_accum > 1,
                }
            } else {
                dp::Update::Separate
            };
            let d = dp_state.insert(dp::DataParallel::new(
                comms,
                sharding,
                update,
                model.params(),
                s.cfg.layers as usize,
                s.precision.compute_kind(),
                dev.device,
            )?);
            // The split update is the default here (BENCH_OVERLAP_ADAMW=0 turns it off):
            // measured faster under DDP and never slower (docs/perf-notes.md, 2026-11-27).
            // (Without gradient accumulation only: `enable_split_update` needs the kernel's
            // update without sums.)
            if overlap_switch != Some(false) && d.enable_split_update()? {
                parallel_said.push_str("; the update split around the last collectives");
                notices.push("data parallel: the update is split around the step's last collectives (the default; BENCH_OVERLAP_ADAMW=0 turns it off): every unit already reduced is updated while block 0's and the embeddings' collectives run".to_string());
            }
            // The peak memory of the training steps: the freshly built fp32 model existed
            // whole on each rank only until it was cut into slices.
            dev.reset_peak_memory()?;
            train::Parallel::Data(&*d)
        }
    };
    let scaling = match s.precision {
        Precision::Fp8 => precision::fp8::Scaling::from_env().map_err(WorkerError::BadInput)?,
        _ => precision::fp8::Scaling::Dynamic,
    };
    let ctx = Ctx::for_training(s.precision, s.cfg.layers as usize, dev.device, scaling);
    // Said in the run's events, so that a result is never taken for the other scaling's.
    notices.extend(match (ctx.fp8 && dev.device.is_cuda(), scaling) {
        (true, precision::fp8::Scaling::Delayed) => Some(format!(
            "fp8: delayed scaling (the default): each tensor is scaled by its linear's amax history of the last {} steps, recorded by the quantization pass",
            ffi::fp8_scaling_cols() - 2
        )),
        (true, precision::fp8::Scaling::Dynamic) => Some(
            "fp8: dynamic scaling (BENCH_FP8_SCALING=dynamic): each tensor is scaled by its own amax, a reduction pass before each quantization".to_string(),
        ),
        (false, _) => None,
    });
    let n_params = s.cfg.n_params();
    emit(Event::Start {
        model: Some(s.cfg.name.to_string()),
        n_params: Some(n_params),
        device: Some(dev.name.clone()),
        world_size: Some(world),
    });
    for message in notices {
        emit(Event::Notice { message });
    }
    eprintln!(
        "bench worker {}: {} ({:.1}M params) {:?} on {}, batch {}x{} x{} accum, sac {:?}, compile {}",
        args.cell_id,
        s.cfg.name,
        n_params as f64 / 1e6,
        s.precision,
        dev.name,
        s.micro_batch,
        s.seq_len,
        s.grad_accum,
        s.sac_every,
        cuda_graph
    );
    let cfg = optim::AdamWConfig::new(args.lr);
    let opt = match parallel {
        train::Parallel::Data(d) => d.optimizer(cfg)?,
        train::Parallel::Single if master_weights(s, dev) => {
            let opt = optim::AdamW::with_masters(model.params(), cfg, s.grad_accum > 1)
                .map_err(WorkerError::from_device)?;
            // As under DDP and FSDP: the fp32 model existed whole only until it was copied
            // into the flat buffers.
            dev.reset_peak_memory()?;
            opt
        }
        train::Parallel::Single => optim::AdamW::new(model.params(), cfg, dev.is_cuda()),
    };
    // Global: every rank processes micro_batch x grad_accum sequences per step.
    let tokens_per_step = (s.micro_batch * s.seq_len) as u64 * s.grad_accum as u64 * world as u64;
    let mut rec = measure::Recorder::default();
    let overlap = match (parallel, dev.device) {
        (train::Parallel::Single, tch::Device::Cuda(i))
            if overlap::Overlap::wanted(&opt, s.grad_accum, overlap_switch) =>
        {
            Some(overlap::Overlap::new(model.as_ref(), i as i64)?)
        }
        _ => None,
    };
    let lp = train::Loop {
        model: model.as_ref(),
        ctx,
        device: dev,
        opt,
        data,
        steps: s.steps,
        warmup,
        grad_accum: s.grad_accum,
        sac_every: s.sac_every,
        cuda_graph,
        tokens_per_step,
        started,
        parallel,
        overlap,
    };
    let opt = lp.run(&mut emit, &mut rec)?;
    let facts = measure::RunFacts {
        tokens_per_step,
        world_size: world,
        n_params,
        flops_per_token: flops::flops_per_token(
            s.cfg.n_matmul_params(),
            s.cfg.layers as u64,
            s.cfg.hidden as u64,
            s.seq_len as u64,
        ),
        peak: flops::peak_tflops(&dev.name, s.precision),
        peak_mem_bytes: dev.peak_memory()?,
        device: dev.name.clone(),
    };
    let mut summary = measure::summary(&rec, &facts);
    summary.ran = Some(Box::new(ran_record(
        s,
        dev,
        cuda_graph,
        scaling,
        parallel_said,
    )));
    // Every rank's peak, in rank order (index = rank), gathered to rank 0.
    let mine = facts.peak_mem_bytes.unwrap_or(0);
    match parallel {
        train::Parallel::Data(d) if group.is_some() => {
            summary.peak_mem_bytes = d.gather_u64(mine)?
        }
        _ => {}
    }
    if std::env::var_os("BENCH_PARAM_CHECKSUM").is_some() {
        let (sum, sumsq) = match parallel {
            train::Parallel::Data(d) => d.param_checksum()?,
            _ => opt
                .master_checksum()
                .unwrap_or_else(|| dp::param_checksum(model.params())),
        };
        eprintln!("{}", dp::checksum_line(rank, sum, sumsq));
    }
    emit(Event::Summary(summary));
    Ok(())
}

/// What this worker ran, from the decisions it made above (not from the switches it was
/// given): the comparison table shows it beside each framework's own record.
fn ran_record(
    s: &Settings,
    dev: &DeviceInfo,
    cuda_graph: bool,
    scaling: precision::fp8::Scaling,
    parallel: String,
) -> crate::events::Ran {
    let execution = match (s.compile, cuda_graph) {
        (_, true) => "eager warm-up, then the whole step as one CUDA graph (bench's `compile`)".to_string(),
        (true, false) if dev.is_cuda() => format!(
            "eager: `compile` asked, but CUDA graphs are not used with {} (its collectives run between blocks)",
            s.parallel.name()
        ),
        (true, false) => "eager: `compile` asked, but the device has no CUDA graphs".to_string(),
        (false, false) => "eager".to_string(),
    };
    let checkpointing = match s.sac_every {
        None => "none".to_string(),
        Some(1) => {
            "every block recomputed from its input in the backward (block-level)".to_string()
        }
        Some(k) => {
            format!("every {k}th block recomputed from its input in the backward (block-level)")
        }
    };
    let optimizer = if master_weights(s, dev) {
        "AdamW: bench's fused kernel over flat fp32 masters and moments, writing the bf16 weights"
            .to_string()
    } else if dev.is_cuda() {
        "AdamW: libtorch's fused CUDA kernel over fp32 parameters".to_string()
    } else {
        "AdamW: libtorch's per-tensor update over fp32 parameters".to_string()
    };
    let precision = match s.precision {
        Precision::Fp32 => "fp32 throughout".to_string(),
        Precision::Bf16 => {
            "bf16 matmuls and activations; fp32 master weights and AdamW state".to_string()
        }
        Precision::Fp8 => {
            let scaled = match (dev.is_cuda(), scaling) {
                (true, precision::fp8::Scaling::Delayed) => "delayed scaling",
                _ => "dynamic scaling",
            };
            let head = if std::env::var("BENCH_FP8_HEAD").is_ok_and(|v| v == "1") {
                "fp8"
            } else {
                "bf16"
            };
            format!("fp8 block linears (_scaled_mm, tensorwise, {scaled}); head in {head}, the rest bf16; fp32 master weights and AdamW state")
        }
    };
    crate::events::Ran {
        execution: Some(execution),
        attention: Some(models::attention_kernel(
            &s.cfg,
            s.seq_len,
            s.micro_batch,
            dev.device,
            s.precision.compute_kind(),
        )),
        checkpointing: Some(checkpointing),
        optimizer: Some(optimizer),
        precision: Some(precision),
        parallel: Some(parallel),
        evidence: vec![
            "the built-in worker's own settings, and libtorch's SDPA choice at this shape"
                .to_string(),
        ],
    }
}

/// Trains as `args` asks and returns the worker's exit code (see `exit::worker`).
pub(super) fn run_training(args: &WorkerSettings) -> i32 {
    let started = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| run(args, started))).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "libtorch raised an error".to_string());
        Err(WorkerError::from_device(msg))
    });
    match result {
        Ok(()) => crate::exit::worker::OK,
        Err(e) => {
            let kind = e.kind();
            eprintln!("bench worker {}: {e}", args.cell_id);
            emit(Event::Error {
                kind,
                message: e.to_string(),
            });
            kind.exit_code()
        }
    }
}
