//! Every framework adapter's declared tables, side by side: what each can express
//! ([`Capabilities`], written as what differs from [`Capabilities::llama`], so that each
//! table reads as the list of what its framework cannot do, with the reason the dry run
//! prints), how each starts ([`Launch`]), and which of its log lines say what ran
//! ([`Signature`], read into the cell's record by [`super::ran`]). The shared check
//! ([`super::capability::check`]), the launch ([`Launch::command`]) and docs/frameworks.md's
//! capability tables read them; the adapters' own files keep only their config mapping and
//! their log lines. The tables stand in one file so that they read side by side and a new
//! framework's table is written next to the others it resembles.

use super::adapter::Framework;
use super::capability::{ByDtype, ByParallel, Can, Capabilities, Feature, Models};
use super::deepspeed;
use super::hf;
use super::launch::{Launch, Ranks};
use super::llmc;
use super::maxtext;
use super::megatron;
use super::ran::Signature;
use super::torchtitan;

/// What the torchtitan adapter maps: every dtype (fp8 through torchao's Float8Linear),
/// selective checkpointing of every k-th block, and tensor parallelism beside FSDP; no
/// pipeline or context parallelism yet.
///
/// torchrun for one rank as well: torchtitan's Trainer initialises torch.distributed.
pub(crate) static TORCHTITAN: Framework = Framework {
    name: torchtitan::NAME,
    adapter: &torchtitan::Torchtitan,
    capabilities: Capabilities {
        pp: Can::No("the torchtitan adapter does not map pipeline schedules (pp > 1) yet"),
        tp_with_ddp: Can::No("torchtitan's DDP does not combine with tensor parallelism"),
        ..Capabilities::llama(torchtitan::NAME)
    },
    launch: Launch {
        driver: "torchtitan_train.py",
        config_flag: "--job.config_file",
        ranks: Ranks::Torchrun,
        args_on_command_line: true,
        source_env: None,
    },
    // torchtitan's own log lines that say what ran (0.2.2's wording), read into the cell's
    // record of what ran (`super::ran`); its driver adds the optimizer, the precision policy
    // and the attention kernel it resolved.
    signatures: &[
        Signature { aspect: "execution", pattern: r"Compiling each TransformerBlock with torch\.compile", says: "torch.compile of each TransformerBlock" },
        Signature { aspect: "execution", pattern: r"Compiling the loss function with torch\.compile", says: "torch.compile of the loss" },
        Signature { aspect: "checkpointing", pattern: r"Applied selective activation checkpointing", says: "torchtitan's selective activation checkpointing (per-layer option: whole blocks recomputed)" },
        Signature { aspect: "checkpointing", pattern: r"Applied full activation checkpointing", says: "full activation checkpointing" },
        Signature { aspect: "precision", pattern: r"Float8 training active with recipe (\w+)", says: "fp8 linears: torchao Float8Linear, $1 scaling" },
        Signature { aspect: "precision", pattern: r"Mixed precision training is handled by AMP", says: "mixed precision by AMP autocast" },
        Signature { aspect: "precision", pattern: r"Mixed precision training is handled by fully_shard", says: "mixed precision by FSDP2's policy" },
        Signature { aspect: "parallel", pattern: r"Applied FSDP to the model", says: "FSDP2 (fully_shard) of every block" },
        Signature { aspect: "parallel", pattern: r"Applied DDP to the model", says: "DDP" },
        Signature { aspect: "parallel", pattern: r"Successfully created meshes with active dimensions: \[\]", says: "no active mesh dimension: no FSDP or DDP applied (a plain loop)" },
        Signature { aspect: "attention", pattern: r#""attn_type": "(\w+)""#, says: "torchtitan `$1` attention" },
    ],
    torch_based: true,
};

/// What the HF Trainer adapter maps: no fp8, no tensor or pipeline parallelism, and
/// checkpointing of every block or none.
///
/// One GPU runs the driver alone; the Trainer wraps DDP or FSDP under torchrun.
pub(crate) static HF: Framework = Framework {
    name: hf::NAME,
    adapter: &hf::Hf,
    capabilities: Capabilities {
        dtypes: ByDtype {
            fp8: Can::No("the HF Trainer has no fp8 training of its own (accelerate's FP8 needs Transformer Engine or torchao recipes the adapter does not map)"),
            ..ByDtype::ALL
        },
        sac_every: Can::No("the Trainer's gradient checkpointing covers every block; sac_every {sac_every} has no Trainer equivalent"),
        tp: Can::No(NO_TP_PP),
        pp: Can::No(NO_TP_PP),
        ..Capabilities::llama("the HF Trainer")
    },
    launch: Launch {
        driver: "hf_train.py",
        config_flag: "--config",
        ranks: Ranks::TorchrunForSeveral,
        args_on_command_line: true,
        source_env: None,
    },
    // The Trainer logs little of what it runs; its driver prints the record (`super::ran`)
    // from the Trainer's resolved arguments and model.
    signatures: &[],
    torch_based: true,
};

/// What the Megatron adapter maps with the local layer spec: no torch.compile and no fp8
/// (both need what the local spec leaves out), full recompute of every layer, and tensor
/// and pipeline parallelism that split the preset exactly.
///
/// Megatron initialises torch.distributed even for one rank; torchrun sets its variables
/// and prefixes every rank's lines. The matrix's `args` are Megatron's own flags, in the
/// config.
pub(crate) static MEGATRON: Framework = Framework {
    name: megatron::NAME,
    adapter: &megatron::Megatron,
    capabilities: Capabilities {
        dtypes: ByDtype {
            fp8: Can::No("fp8 in Megatron-Core runs through Transformer Engine layers; the adapter builds the local layer spec, which has none"),
            ..ByDtype::ALL
        },
        features: &[
            ("compile", Feature::Refused("Megatron-Core has no torch.compile of the model (its speed comes from fused kernels, which the local layer spec leaves out); run it without `compile`")),
            ("sac", Feature::Optional),
        ],
        sac_every: Can::No("Megatron's full recompute checkpoints every layer (`--recompute-method uniform --recompute-num-layers 1`); sac_every {sac_every} has no Megatron equivalent"),
        tp_divides_vocab: Some("Megatron would pad it, and the model would not be the preset"),
        ..Capabilities::llama("Megatron-Core")
    },
    launch: Launch {
        driver: "megatron_train.py",
        config_flag: "--config",
        ranks: Ranks::Torchrun,
        args_on_command_line: false,
        source_env: Some("BENCH_MEGATRON_SOURCE"),
    },
    // Megatron prints every argument it resolved (`  name ..... value`); these are the ones
    // that say what ran, read into the cell's record (`super::ran`).
    signatures: &[
        Signature { aspect: "execution", pattern: r"^\s*cuda_graph_impl \.+ none\s*$", says: "eager (no CUDA graphs; Megatron has no torch.compile of the model)" },
        Signature { aspect: "execution", pattern: r"^\s*cuda_graph_impl \.+ (local|transformer_engine)\s*$", says: "CUDA graphs ($1)" },
        Signature { aspect: "attention", pattern: r"^\s*transformer_impl \.+ local\s*$", says: "the local layer spec's unfused DotProductAttention (scores materialised; no Transformer Engine)" },
        Signature { aspect: "attention", pattern: r"^\s*transformer_impl \.+ transformer_engine\s*$", says: "Transformer Engine's attention" },
        Signature { aspect: "attention", pattern: r"^\s*use_flash_attn \.+ True\s*$", says: "flash attention" },
        Signature { aspect: "checkpointing", pattern: r"^\s*recompute_granularity \.+ (\w+)\s*$", says: "$1 recompute" },
        Signature { aspect: "checkpointing", pattern: r"^\s*recompute_method \.+ (\w+)\s*$", says: "method $1" },
        Signature { aspect: "checkpointing", pattern: r"^\s*recompute_num_layers \.+ (\d+)\s*$", says: "$1 layer(s) per recompute unit" },
        Signature { aspect: "optimizer", pattern: r"^\s*optimizer \.+ (\w+)\s*$", says: "Megatron's $1 (decoupled weight decay)" },
        Signature { aspect: "optimizer", pattern: r"^\s*use_distributed_optimizer \.+ True\s*$", says: "distributed optimizer" },
        Signature { aspect: "precision", pattern: r"^\s*bf16 \.+ True\s*$", says: "bf16 weights and activations" },
        Signature { aspect: "precision", pattern: r"^\s*main_params_dtype \.+ torch\.(\w+)\s*$", says: "$1 main params" },
        Signature { aspect: "precision", pattern: r"^\s*fp8 \.+ (e4m3|hybrid)\s*$", says: "fp8 ($1)" },
        Signature { aspect: "parallel", pattern: r"^\s*use_torch_fsdp2 \.+ True\s*$", says: "torch FSDP2" },
        Signature { aspect: "parallel", pattern: r"^\s*use_torch_fsdp2 \.+ False\s*$", says: "Megatron's own DDP wrapper (torch FSDP2 off)" },
        Signature { aspect: "parallel", pattern: r"^\s*data_parallel_size \.+ (\d+)\s*$", says: "data-parallel size $1" },
    ],
    torch_based: true,
};

/// What the DeepSpeed adapter maps: no fp8, no tensor or pipeline parallelism, and
/// checkpointing of every block or none; the ZeRO stage is checked by [`zero_refusal`].
///
/// torchrun for one rank as well: the engine initialises torch.distributed.
pub(crate) static DEEPSPEED: Framework = Framework {
    name: deepspeed::NAME,
    adapter: &deepspeed::DeepSpeed,
    capabilities: Capabilities {
        dtypes: ByDtype {
            fp8: Can::No("DeepSpeed's engine has no fp8 training of its own (it needs Transformer Engine layers the adapter does not build)"),
            ..ByDtype::ALL
        },
        sac_every: Can::No("the model's gradient checkpointing covers every block; sac_every {sac_every} has no equivalent"),
        tp: Can::No(NO_MODEL_PARALLEL),
        pp: Can::No(NO_MODEL_PARALLEL),
        further: Some("a `zero` axis (0-3) agrees with `parallel`: 3 is fsdp, 0-2 ddp or single"),
        ..Capabilities::llama("DeepSpeed")
    },
    launch: Launch {
        driver: "deepspeed_train.py",
        config_flag: "--config",
        ranks: Ranks::Torchrun,
        args_on_command_line: true,
        source_env: None,
    },
    // DeepSpeed's own log lines that say what ran (0.19's wording), read into the cell's
    // record (`super::ran`); its driver adds what the engine holds (ZeRO stage, optimizer,
    // attention), and dynamo's recompile-limit warning, shared by every torch stack, says
    // when its compile fell back to eager.
    signatures: &[
        Signature {
            aspect: "execution",
            pattern: r"\] Compiling mode=(\w+) deepcompile=(\w+) backend=(\w+)",
            says: "torch.compile through engine.compile() (mode $1, deepcompile $2, backend $3)",
        },
        Signature {
            aspect: "optimizer",
            pattern: r"DeepSpeed Final Optimizer = (\w+)",
            says: "DeepSpeed's final optimizer $1",
        },
    ],
    torch_based: true,
};

/// What the MaxText adapter maps: every step jitted (so `compile` is required), fp8 without
/// gradient accumulation, `remat_policy: full` for every layer, and tensor parallelism on
/// its tensor axis beside fsdp.
///
/// One JAX process drives the host's devices (no launcher).
pub(crate) static MAXTEXT: Framework = Framework {
    name: maxtext::NAME,
    adapter: &maxtext::MaxText,
    capabilities: Capabilities {
        fp8_with_grad_accum: Can::No("MaxText's fp8 (`quantization: fp8`) does not run with gradient accumulation"),
        features: &[
            ("compile", Feature::Required("MaxText always runs its train step under jax.jit (XLA-compiled); a cell without `compile` would not run as it says")),
            ("sac", Feature::Optional),
        ],
        sac_every: Can::No("MaxText's `remat_policy: full` checkpoints every decoder layer; sac_every {sac_every} has no MaxText equivalent"),
        pp: Can::No("the MaxText adapter does not map pipeline stages (pp > 1)"),
        tp_with_ddp: Can::No("the adapter maps ddp to MaxText's data axis and tensor parallelism to its tensor axis only with fsdp"),
        ..Capabilities::llama("MaxText")
    },
    launch: Launch {
        driver: "maxtext_train.py",
        config_flag: "--config",
        ranks: Ranks::Driver("one JAX process for the host's GPUs"),
        args_on_command_line: true,
        source_env: None,
    },
    // MaxText prints every config value it resolved (`Config param name: value`); these are
    // the ones that say what ran, read into the cell's record (`super::ran`). Every MaxText
    // step is one jitted XLA program.
    signatures: &[
        Signature {
            aspect: "execution",
            pattern: r"Config param scan_layers: (\w+)$",
            says: "jax.jit of the whole step (scan_layers $1)",
        },
        Signature {
            aspect: "attention",
            pattern: r"Config param attention: (\w+)$",
            says: "MaxText `$1` attention",
        },
        Signature {
            aspect: "checkpointing",
            pattern: r"Config param remat_policy: (\w+)$",
            says: "remat policy `$1`",
        },
        Signature {
            aspect: "optimizer",
            pattern: r"Config param opt_type: OptimizerType\.(\w+)$",
            says: "optax $1",
        },
        Signature {
            aspect: "optimizer",
            pattern: r"Config param mu_dtype: (\w+)$",
            says: "moments in $1",
        },
        Signature {
            aspect: "precision",
            pattern: r"Config param dtype: (\w+)$",
            says: "activations in $1",
        },
        Signature {
            aspect: "precision",
            pattern: r"Config param weight_dtype: (\w+)$",
            says: "weights in $1",
        },
        Signature {
            aspect: "precision",
            pattern: r"Config param quantization: QuantizationType\.(FP8\w*|INT8\w*|NANOO\w*)$",
            says: "quantization $1",
        },
        Signature {
            aspect: "parallel",
            pattern: r"Config param ici_fsdp_parallelism: (\d+)$",
            says: "FSDP over $1 device(s) (ici_fsdp_parallelism)",
        },
    ],
    torch_based: false,
};

/// What the llm.c adapter maps: GPT-2 of llm.c's four depths (`gpt2_set_hyperparameters`
/// in train_gpt2.cu, as (layers, width, heads)) at up to its 1,024 positions, bf16 or fp32
/// builds, and data parallelism only; llm.c has no compiler and no block checkpointing.
///
/// The driver builds llm.c and starts one process per GPU itself (llm.c's own NCCL
/// rendezvous, no torchrun); the matrix's `args` are llm.c's flags, in the config.
pub(crate) static LLMC: Framework = Framework {
    name: llmc::NAME,
    adapter: &llmc::Llmc,
    capabilities: Capabilities {
        models: Models::Gpt2 {
            shapes: &[(12, 768, 12), (24, 1024, 16), (36, 1280, 20), (48, 1600, 25)],
            vocab: 50304,
            positions: 1024,
            refusal: "llm.c builds GPT-2 of depth 12, 24, 36 or 48 only (`-e d12` .. `-e d48`: gpt2-125m, gpt2-350m, gpt2-774m, gpt2-1.5b); `{model}` is not one",
        },
        dtypes: ByDtype {
            fp8: Can::No("llm.c's train_gpt2.cu has no fp8 path (it builds in bf16, fp16 or fp32)"),
            ..ByDtype::ALL
        },
        features: &[
            ("compile", Feature::Refused("llm.c is hand-written CUDA: there is no compiler of the model to switch on")),
            ("sac", Feature::Refused("llm.c recomputes only GeLU and LayerNorm outputs in the backward (`-r 1`/`-r 2`), never whole blocks: no equivalent of selective activation checkpointing")),
        ],
        parallel: ByParallel {
            fsdp: Can::No("llm.c shards at most the optimizer state (ZeRO-1, `-z 1`), never the parameters: fsdp cannot run as it says"),
            ..ByParallel::ALL
        },
        tp: Can::No(DATA_PARALLEL_ONLY),
        pp: Can::No(DATA_PARALLEL_ONLY),
        cp: Can::No("llm.c is data parallel only: no context parallelism"),
        max_seq_len: Some((1024, "llm.c's GPT-2 has 1,024 positions; seq_len {seq_len} does not fit")),
        ..Capabilities::llama("llm.c")
    },
    launch: Launch {
        driver: "llmc_train.py",
        config_flag: "--config",
        ranks: Ranks::Driver("the driver starts one llm.c process per GPU"),
        args_on_command_line: false,
        source_env: Some("BENCH_LLMC_SOURCE"),
    },
    // llm.c's build line and its settings table, read into the cell's record (`super::ran`):
    // its own CUDA kernels, no graph capture, no compiler.
    signatures: &[
        Signature {
            aspect: "execution",
            pattern: r"llmc_train\.py: (?:building|cached build): make train_gpt2cu",
            says: "llm.c's hand-written CUDA kernels (no graph capture)",
        },
        Signature {
            aspect: "attention",
            pattern: r"llmc_train\.py: (?:building|cached build): make .*USE_CUDNN=0",
            says: "llm.c's own attention kernels (no cuDNN flash attention)",
        },
        Signature {
            aspect: "attention",
            pattern: r"llmc_train\.py: (?:building|cached build): make .*USE_CUDNN=1",
            says: "cuDNN flash attention",
        },
        Signature {
            aspect: "checkpointing",
            pattern: r"^\| recompute +\| (\d+) ",
            says: "recompute level $1 (0: none, 1: GeLU, 2: GeLU and LayerNorm)",
        },
        Signature {
            aspect: "optimizer",
            pattern: r"^\| use_master_weights +\| (\w+) ",
            says: "llm.c's fused AdamW kernel, fp32 master weights $1",
        },
        Signature {
            aspect: "precision",
            pattern: r"^\| precision +\| (\w+) ",
            says: "$1 weights and activations",
        },
        Signature {
            aspect: "parallel",
            pattern: r"^\| zero_stage +\| (\d+) ",
            says: "ZeRO stage $1",
        },
        Signature {
            aspect: "parallel",
            pattern: r"^\| num_processes +\| (\d+) ",
            says: "$1 process(es)",
        },
    ],
    torch_based: false,
};

/// The HF Trainer's one reason for tp and pp.
const NO_TP_PP: &str = "the HF Trainer has no tensor or pipeline parallelism";

/// DeepSpeed's one reason for tp and pp.
const NO_MODEL_PARALLEL: &str = "DeepSpeed's ZeRO engine has no tensor parallelism, and its pipeline engine needs a model split into stages the adapter does not build";

/// llm.c's one reason for tp and pp.
const DATA_PARALLEL_ONLY: &str = "llm.c is data parallel only: no tensor or pipeline parallelism";
