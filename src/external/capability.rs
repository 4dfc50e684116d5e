//! What each framework adapter can express, declared as data: the [`Capabilities`] table
//! every adapter holds (models, dtypes, features, parallel kinds, tp/pp/cp degrees, sequence
//! length, each refusal with its reason), the one [`check`] that drops a cell against it (the
//! "dropped with reason" line of `bench matrix --dry-run` and the refusal of `bench adapt`),
//! and the Markdown of all tables that docs/frameworks.md carries verbatim ([`markdown`]; a
//! test below fails when the document and the tables differ).
//!
//! The checks run in one order for every adapter, the first refusal wins: the model; the
//! features the framework refuses outright; the checks every framework cell shares (known
//! features, ranks, warm-up, batch); the features it requires; the dtype (and what it
//! excludes); `sac_every`; the parallel kind; the tp, pp and cp degrees; what the degrees must
//! divide; the sequence length; and last the adapter's own condition that is no table data
//! ([`super::adapter::Adapter::refuses`], DeepSpeed's ZeRO stage). The order is the one the
//! hand-written checks had, so a cell keeps the reason it was dropped with; the one
//! exception is llm.c, which checked its dtype before its features (a cell that fails both
//! is now dropped for the feature).

use crate::axes::{Dtype, Parallel};
use crate::cell::Cell;
use crate::workload::models::presets::{self, Family};

/// Whether an adapter maps something a cell asks for, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Can {
    Yes,
    /// The cell is dropped with this reason.
    No(&'static str),
}

/// How an adapter treats a feature flag.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Feature {
    /// Mapped when the cell asks for it, left off when not.
    Optional,
    /// The framework always does it: a cell without the flag is dropped with the reason.
    Required(&'static str),
    /// The framework cannot do it: a cell with the flag is dropped with the reason.
    Refused(&'static str),
}

/// The bench presets an adapter can build.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Models {
    /// Llama-3-style presets: the Llama family without QKV bias.
    Llama,
    /// GPT-2 presets of exactly these (layers, width, heads), with tied embeddings and this
    /// vocabulary and number of positions; any other model is dropped with `refusal`
    /// (`{model}` in it is the model's name).
    Gpt2 {
        shapes: &'static [(i64, i64, i64)],
        vocab: i64,
        positions: i64,
        refusal: &'static str,
    },
}

/// One [`Can`] per dtype.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ByDtype {
    pub bf16: Can,
    pub fp32: Can,
    pub fp8: Can,
}

impl ByDtype {
    /// Every dtype mapped.
    pub(crate) const ALL: ByDtype = ByDtype {
        bf16: Can::Yes,
        fp32: Can::Yes,
        fp8: Can::Yes,
    };

    pub(crate) fn get(&self, d: Dtype) -> Can {
        match d {
            Dtype::Bf16 => self.bf16,
            Dtype::Fp32 => self.fp32,
            Dtype::Fp8 => self.fp8,
        }
    }
}

/// One [`Can`] per parallel kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ByParallel {
    pub single: Can,
    pub ddp: Can,
    pub fsdp: Can,
}

impl ByParallel {
    /// Every parallel kind mapped.
    pub(crate) const ALL: ByParallel = ByParallel {
        single: Can::Yes,
        ddp: Can::Yes,
        fsdp: Can::Yes,
    };

    pub(crate) fn get(&self, k: Parallel) -> Can {
        match k {
            Parallel::Single => self.single,
            Parallel::Ddp => self.ddp,
            Parallel::Fsdp => self.fsdp,
        }
    }
}

/// What one framework adapter can express. Reasons may name the cell's value with
/// `{sac_every}` or `{seq_len}`. An adapter writes what differs from
/// [`Capabilities::llama`], so its table reads as the list of what it cannot do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Capabilities {
    /// How a reason names the framework (`the HF Trainer`).
    pub framework: &'static str,
    pub models: Models,
    pub dtypes: ByDtype,
    /// fp8 together with gradient accumulation (where fp8 is mapped).
    pub fp8_with_grad_accum: Can,
    /// Every feature flag the adapter knows; any other is dropped.
    pub features: &'static [(&'static str, Feature)],
    /// Selective activation checkpointing of every k-th block with k > 1.
    pub sac_every: Can,
    pub parallel: ByParallel,
    /// Tensor, pipeline and context parallel degrees above 1 (the `tp`, `pp`, `cp` axes).
    pub tp: Can,
    pub pp: Can,
    pub cp: Can,
    /// Tensor parallelism combined with `parallel: ddp`.
    pub tp_with_ddp: Can,
    /// Why tp must divide the vocabulary as well, where it must.
    pub tp_divides_vocab: Option<&'static str>,
    /// The longest sequence the model takes, and the reason a longer one is dropped.
    pub max_seq_len: Option<(u32, &'static str)>,
    /// The adapter's own condition beyond the table, in words, for the documentation.
    pub further: Option<&'static str>,
}

impl Capabilities {
    /// A framework that maps everything bench asks of a Llama cell except context
    /// parallelism, which no adapter maps (a `cp` axis would otherwise be ignored while the
    /// cell's id says it ran).
    pub(crate) const fn llama(framework: &'static str) -> Capabilities {
        Capabilities {
            framework,
            models: Models::Llama,
            dtypes: ByDtype::ALL,
            fp8_with_grad_accum: Can::Yes,
            features: &[("compile", Feature::Optional), ("sac", Feature::Optional)],
            sac_every: Can::Yes,
            parallel: ByParallel::ALL,
            tp: Can::Yes,
            pp: Can::Yes,
            cp: Can::No("the adapter does not map context parallelism (cp > 1)"),
            tp_with_ddp: Can::Yes,
            tp_divides_vocab: None,
            max_seq_len: None,
            further: None,
        }
    }
}

/// Why `caps` cannot express `cell`, if it cannot (the order is the module doc's).
pub(crate) fn check(caps: &Capabilities, cell: &Cell) -> Option<String> {
    let fw = caps.framework;
    let cfg = match model(caps, cell) {
        Ok(cfg) => cfg,
        Err(why) => return Some(why),
    };
    let features = cell.features();
    for (name, f) in caps.features {
        if let Feature::Refused(why) = f {
            if features.contains(*name) {
                return Some((*why).into());
            }
        }
    }
    if let Some(why) = super::mapping::common_checks(cell, fw, &mapped_features(caps)) {
        return Some(why);
    }
    for (name, f) in caps.features {
        if let Feature::Required(why) = f {
            if !features.contains(*name) {
                return Some((*why).into());
            }
        }
    }
    let dtype = cell.dtype();
    if let Can::No(why) = caps.dtypes.get(dtype) {
        return Some(why.into());
    }
    let p = &cell.params;
    if let (Dtype::Fp8, true, Can::No(why)) = (dtype, p.grad_accum > 1, caps.fp8_with_grad_accum) {
        return Some(why.into());
    }
    if let (true, Can::No(why)) = (features.contains("sac") && p.sac_every != 1, caps.sac_every) {
        return Some(why.replace("{sac_every}", &p.sac_every.to_string()));
    }
    if let Can::No(why) = caps.parallel.get(cell.parallel()) {
        return Some(why.into());
    }
    let (tp, pp, cp) = (
        super::mapping::degree(cell, "tp"),
        super::mapping::degree(cell, "pp"),
        super::mapping::degree(cell, "cp"),
    );
    for (degree, can) in [(pp, caps.pp), (tp, caps.tp), (cp, caps.cp)] {
        if let (true, Can::No(why)) = (degree > 1, can) {
            return Some(why.into());
        }
    }
    if let (true, Can::No(why)) = (tp > 1 && cell.parallel() == Parallel::Ddp, caps.tp_with_ddp) {
        return Some(why.into());
    }
    if cfg.heads % i64::from(tp) != 0 || cfg.kv_heads % i64::from(tp) != 0 {
        return Some(format!(
            "tp {tp} does not divide the {} heads and {} key/value heads",
            cfg.heads, cfg.kv_heads
        ));
    }
    if cfg.layers % i64::from(pp) != 0 {
        return Some(format!("pp {pp} does not divide the {} layers", cfg.layers));
    }
    if let Some(why) = caps.tp_divides_vocab {
        if cfg.vocab % i64::from(tp) != 0 {
            return Some(format!(
                "tp {tp} does not divide the vocabulary of {}: {why}",
                cfg.vocab
            ));
        }
    }
    if let Some((max, why)) = caps.max_seq_len {
        if p.seq_len > max {
            return Some(why.replace("{seq_len}", &p.seq_len.to_string()));
        }
    }
    None
}

/// The cell's preset if `caps` builds it, else why not.
fn model(
    caps: &Capabilities,
    cell: &Cell,
) -> Result<crate::workload::models::presets::ModelConfig, String> {
    match caps.models {
        Models::Llama => super::mapping::llama_preset(cell, caps.framework),
        Models::Gpt2 {
            shapes,
            vocab,
            positions,
            refusal,
        } => {
            let name = cell.model();
            let cfg = presets::get(name).ok_or_else(|| {
                format!(
                    "model `{name}` is not a bench preset, so {} cannot be given its shape",
                    caps.framework
                )
            })?;
            let built = cfg.family == Family::Gpt2
                && cfg.vocab == vocab
                && cfg.max_seq == positions
                && cfg.tied_embeddings
                && shapes.contains(&(cfg.layers, cfg.hidden, cfg.heads));
            if built {
                Ok(cfg)
            } else {
                Err(refusal.replace("{model}", name))
            }
        }
    }
}

/// The features an adapter maps (optional or required), in table order.
fn mapped_features(caps: &Capabilities) -> Vec<&'static str> {
    caps.features
        .iter()
        .filter(|(_, f)| !matches!(f, Feature::Refused(_)))
        .map(|(n, _)| *n)
        .collect()
}

/// The Markdown docs/frameworks.md carries of the tables, rendered here and compared with
/// the document by the test below (the document cannot drift from the tables).
#[cfg(test)]
mod markdown {
    use super::*;
    use crate::external::launch::{Launch, Ranks};
    use crate::external::{Framework, ADAPTERS};

    /// `a`, `a or b`, `a, b or c`.
    fn or_list(xs: &[&str]) -> String {
        match xs {
            [] => "anything".into(),
            [one] => (*one).into(),
            [head @ .., last] => format!("{} or {last}", head.join(", ")),
        }
    }

    /// The Markdown of every adapter's table, as docs/frameworks.md carries it between its
    /// `capabilities` markers: one column per adapter, then each adapter's reasons as the dry run
    /// prints them.
    pub(crate) fn markdown(adapters: &[&Framework]) -> String {
        let mut rows: Vec<(String, Vec<String>)> = vec![];
        let mut row = |name: &str, cell: &dyn Fn(&Capabilities, &Launch) -> String| {
            let cells = adapters
                .iter()
                .map(|a| cell(&a.capabilities, &a.launch))
                .collect();
            rows.push((name.to_string(), cells));
        };
        let yes_no = |c: Can| match c {
            Can::Yes => "yes".to_string(),
            Can::No(_) => "dropped".to_string(),
        };
        row("models", &|c, _| match c.models {
            Models::Llama => "Llama-3-style presets".into(),
            Models::Gpt2 { shapes, .. } => {
                let depths: Vec<String> = shapes.iter().map(|s| s.0.to_string()).collect();
                let depths: Vec<&str> = depths.iter().map(String::as_str).collect();
                format!("GPT-2 presets of depth {}", or_list(&depths))
            }
        });
        for d in [Dtype::Bf16, Dtype::Fp32, Dtype::Fp8] {
            row(&format!("`dtype: {}`", d.name()), &|c, _| match (
                d,
                c.dtypes.get(d),
                c.fp8_with_grad_accum,
            ) {
                (Dtype::Fp8, Can::Yes, Can::No(_)) => "yes, without `grad_accum` > 1".into(),
                (_, can, _) => yes_no(can),
            });
        }
        for k in [Parallel::Single, Parallel::Ddp, Parallel::Fsdp] {
            row(&format!("`parallel: {}`", k.name()), &|c, _| {
                yes_no(c.parallel.get(k))
            });
        }
        for f in ["compile", "sac"] {
            row(&format!("`features: {f}`"), &|c, _| {
                let feature = c.features.iter().find(|(n, _)| *n == f).map(|(_, x)| *x);
                match (feature, f, c.sac_every) {
                    (Some(Feature::Optional), "sac", Can::No(_)) => {
                        "yes, `sac_every` 1 only".into()
                    }
                    (Some(Feature::Optional), _, _) => "yes".into(),
                    (Some(Feature::Required(_)), _, _) => "required".into(),
                    (Some(Feature::Refused(_)) | None, _, _) => "dropped".into(),
                }
            });
        }
        row(
            "`tp` > 1",
            &|c, _| match (c.tp, c.tp_with_ddp, c.tp_divides_vocab) {
                (Can::No(_), _, _) => "dropped".into(),
                (Can::Yes, ddp, vocab) => format!(
                    "yes{}; divides heads, KV heads{}",
                    if ddp == Can::Yes {
                        ""
                    } else {
                        ", not with ddp"
                    },
                    if vocab.is_some() {
                        " and vocabulary"
                    } else {
                        ""
                    }
                ),
            },
        );
        row("`pp` > 1", &|c, _| match c.pp {
            Can::Yes => "yes; divides layers".into(),
            Can::No(_) => "dropped".into(),
        });
        row("`cp` > 1", &|c, _| yes_no(c.cp));
        row("`seq_len`", &|c, _| match c.max_seq_len {
            Some((max, _)) => format!("at most {max}"),
            None => "any".into(),
        });
        row("further", &|c, _| c.further.unwrap_or("").to_string());
        row("ranks", &|_, l| ranks(l.ranks).to_string());

        let mut md = String::from("| |");
        for a in adapters {
            md.push_str(&format!(" {} |", a.name()));
        }
        md.push_str("\n|---|");
        md.push_str(&"---|".repeat(adapters.len()));
        md.push('\n');
        for (name, cells) in &rows {
            md.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
        }
        for a in adapters {
            md.push_str(&format!(
                "\n{} drops, with the reason the dry run prints:\n\n",
                a.name()
            ));
            for (what, why) in reasons(&a.capabilities) {
                md.push_str(&format!("- {what}: {why}\n"));
            }
        }
        md
    }

    /// How the ranks start, in the table's words.
    fn ranks(r: Ranks) -> &'static str {
        match r {
            Ranks::Torchrun => "torchrun, one rank per GPU",
            Ranks::TorchrunForSeveral => "torchrun for 2+ GPUs, else one process",
            Ranks::Driver(words) => words,
        }
    }

    /// Each refusal of a table, as (what the cell asks for, the reason), in check order.
    fn reasons(c: &Capabilities) -> Vec<(String, String)> {
        let mut out = vec![];
        let placeholder = |why: &str| why.replace("{sac_every}", "N").replace("{seq_len}", "N");
        if let Models::Gpt2 { refusal, .. } = c.models {
            out.push(("another model".into(), refusal.replace("{model}", "M")));
        }
        for (name, f) in c.features {
            match f {
                Feature::Refused(why) => out.push((format!("`{name}`"), placeholder(why))),
                Feature::Required(why) => out.push((format!("no `{name}`"), placeholder(why))),
                Feature::Optional => {}
            }
        }
        for d in [Dtype::Bf16, Dtype::Fp32, Dtype::Fp8] {
            if let Can::No(why) = c.dtypes.get(d) {
                out.push((format!("`dtype: {}`", d.name()), placeholder(why)));
            }
        }
        let more = [
            ("fp8 with `grad_accum` > 1", c.fp8_with_grad_accum),
            ("`sac_every` > 1", c.sac_every),
        ];
        for (what, can) in more {
            if let Can::No(why) = can {
                out.push((what.into(), placeholder(why)));
            }
        }
        for k in [Parallel::Single, Parallel::Ddp, Parallel::Fsdp] {
            if let Can::No(why) = c.parallel.get(k) {
                out.push((format!("`parallel: {}`", k.name()), placeholder(why)));
            }
        }
        let degrees = [
            ("`pp` > 1", c.pp),
            ("`tp` > 1", c.tp),
            ("`cp` > 1", c.cp),
            ("`tp` > 1 with ddp", c.tp_with_ddp),
        ];
        for (what, can) in degrees {
            if let Can::No(why) = can {
                out.push((what.into(), placeholder(why)));
            }
        }
        if let Some((max, why)) = c.max_seq_len {
            out.push((format!("`seq_len` > {max}"), placeholder(why)));
        }
        out
    }

    #[test]
    fn docs_frameworks_md_carries_the_tables() {
        let begin = "<!-- capabilities: generated from src/external/capability.rs -->\n";
        let end = "<!-- end capabilities -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/frameworks.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let want = markdown(ADAPTERS);
        let got = doc
            .split_once(begin)
            .and_then(|(_, rest)| rest.split_once(end))
            .map(|(block, _)| block.trim_matches('\n'));
        assert_eq!(
            got,
            Some(want.trim_matches('\n')),
            "docs/frameworks.md's capability tables differ from the adapters' declared ones; \
             put this between its `capabilities` markers:\n{want}"
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::external::ADAPTERS;

    #[test]
    fn context_parallelism_is_dropped_not_ignored() {
        // No adapter maps a `cp` axis: a cell each would run becomes one each drops with
        // it, rather than one that runs without it while its id says cp 2.
        for a in ADAPTERS {
            let (model, feats): (&str, &[&str]) = match a.name() {
                "llmc" => ("gpt2-125m", &[]),
                "maxtext" => ("llama-tiny", &["compile"]),
                _ => ("llama-tiny", &[]),
            };
            let mut c =
                crate::external::tests::framework_cell(a.name(), model, "bf16", 2, "ddp", feats);
            c.params.seq_len = 1024;
            assert_eq!(a.unexpressible(&c), None, "{}", a.name());
            c.values.insert("cp".into(), crate::cell::Value::Int(2));
            let why = a.unexpressible(&c).unwrap_or_default();
            assert!(why.contains("context parallelism"), "{}: {why}", a.name());
        }
    }
}
