//! Expansion: from a validated [`MatrixSpec`] to cells, in a documented, stable order.
//!
//! Order of operations (docs/matrix.md has the full semantics):
//! 1. every axis gives its values (`subsets_of` generates all subsets, smallest first);
//! 2. `zip` groups advance in lockstep and count as one dimension, placed at the group's
//!    first axis;
//! 3. the cartesian product of the dimensions, first axis slowest (as nested loops written
//!    in file order, and as GitHub Actions orders a matrix);
//! 4. `rules`, in order: the first rule that matches a cell drops it, with its reason;
//! 5. `include`, with GitHub Actions semantics, on the cells that survived;
//! 6. parameters: `defaults`, then `overrides` in axis order, then axes named like
//!    parameters, then parameters set by `include`; then derived values;
//! 7. cell ids, which must be unique.
//!
//! 8. `--filter` expressions, when the caller gives any.
//!
//! The order lives in one place, [`plan::Plan`], which walks the product once to decide
//! each combination's fate and keeps only those fates, rebuilding cells when asked (a dry
//! run of a million combinations writes them one by one); the steps' own rules live beside
//! it: [`validate`] checks axes and overrides, [`rules`] compiles and matches `rules:`, and
//! [`params`] resolves each cell's parameters; [`value`] holds what they share (an axis,
//! value equality), apart from this facade, which imports them.

mod params;
pub(crate) mod plan;
#[cfg(test)]
mod reference;
mod rules;
mod validate;
mod value;

use std::collections::{HashMap, HashSet};

use indexmap::IndexMap;

#[cfg(test)]
use super::budget::Budget;
use super::error::MatrixError;
use super::filter::Vocabulary;
use super::parse::Source;
use super::spec::{MatrixSpec, PARAM_NAMES};
#[cfg(test)]
use super::Dropped;
#[cfg(test)]
use crate::cell::Cell;
use crate::cell::{CellId, Value};

use self::validate::unknown_axis;
pub(crate) use self::validate::MAX_GPUS;
pub(crate) use self::value::value_eq;
use self::value::Axis;

/// A surviving combination before parameters: its values, and parameters set by include.
type Draft = (IndexMap<String, Value>, Vec<(String, Value)>);
/// One dimension of the product: each choice sets one or more (axis, value index) pairs.
type Dimension = Vec<Vec<(usize, usize)>>;

/// The cells of a matrix before filtering, collected (for the tests).
#[cfg(test)]
#[derive(Debug, Clone)]
pub(crate) struct Expanded {
    pub cells: Vec<Cell>,
    pub dropped: Vec<Dropped>,
    pub warnings: Vec<String>,
    /// What filters may name.
    pub vocab: Vocabulary,
    /// Size of the product before rules and include.
    pub combinations: usize,
}

#[cfg(test)]
pub(crate) fn expand(spec: &MatrixSpec, src: &Source) -> Result<Expanded, MatrixError> {
    expand_within(spec, src, Budget::default())
}

/// Expands `spec` into cells (no filters), refusing it before any value is generated when
/// it would exceed `budget` (see [`super::budget`]).
#[cfg(test)]
pub(crate) fn expand_within(
    spec: &MatrixSpec,
    src: &Source,
    budget: Budget,
) -> Result<Expanded, MatrixError> {
    let plan = plan::Plan::new(spec, src, budget, &[], &mut |_| Ok(()))?;
    Ok(Expanded {
        cells: plan.cells().collect(),
        dropped: plan.dropped().collect(),
        warnings: plan.warnings.clone(),
        vocab: plan.vocab.clone(),
        combinations: plan.combinations,
    })
}

fn dimensions(
    spec: &MatrixSpec,
    src: &Source,
    axes: &[Axis],
    axis_index: &HashMap<&str, usize>,
) -> Result<Vec<Dimension>, MatrixError> {
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    for (g, group) in spec.zip.iter().enumerate() {
        if group.len() < 2 {
            return Err(src.error_at(&format!("zip[{g}]"), "a zip group needs at least two axes"));
        }
        let mut len = None;
        for (j, name) in group.iter().enumerate() {
            let path = format!("zip[{g}][{j}]");
            let Some(&a) = axis_index.get(name.as_str()) else {
                return Err(src.error_at(&path, unknown_axis(name, axes)));
            };
            if group_of.insert(a, g).is_some() {
                return Err(src.error_at(
                    &path,
                    format!("axis `{name}` is in more than one zip group"),
                ));
            }
            let n = axes[a].values.len();
            match len {
                None => len = Some(n),
                Some(m) if m != n => {
                    return Err(src.error_at(
                        &path,
                        format!(
                            "zipped axes must have the same number of values: `{}` has {m}, `{name}` has {n}",
                            group[0]
                        ),
                    ))
                }
                _ => {}
            }
        }
    }
    let mut dims = Vec::new();
    let mut done_groups = HashSet::new();
    for (a, axis) in axes.iter().enumerate() {
        match group_of.get(&a) {
            None => dims.push((0..axis.values.len()).map(|v| vec![(a, v)]).collect()),
            Some(&g) => {
                if !done_groups.insert(g) {
                    continue;
                }
                let members: Vec<usize> = spec.zip[g]
                    .iter()
                    .filter_map(|n| axis_index.get(n.as_str()).copied())
                    .collect();
                let n = axis.values.len();
                dims.push(
                    (0..n)
                        .map(|v| members.iter().map(|&m| (m, v)).collect())
                        .collect(),
                );
            }
        }
    }
    Ok(dims)
}

fn vocabulary(spec: &MatrixSpec, axes: &[Axis]) -> Vocabulary {
    let mut params: Vec<String> = PARAM_NAMES.iter().map(|s| s.to_string()).collect();
    params.extend(spec.defaults.extra.keys().cloned());
    for per_value in spec.overrides.values() {
        for patch in per_value.values() {
            params.extend(patch.extra.keys().cloned());
        }
    }
    params.sort();
    params.dedup();
    Vocabulary {
        axes: axes
            .iter()
            .map(|a| (a.name.clone(), a.values.clone()))
            .collect(),
        set_axes: axes
            .iter()
            .filter(|a| a.is_set)
            .map(|a| a.name.clone())
            .collect(),
        params,
    }
}

/// Adds the keys and values that `include` entries introduce, so filters may name them.
fn filter_vocabulary(
    mut vocab: Vocabulary,
    spec: &MatrixSpec,
    axis_index: &HashMap<&str, usize>,
) -> Vocabulary {
    for entry in &spec.include {
        for (k, v) in entry {
            if PARAM_NAMES.contains(&k.as_str()) && !axis_index.contains_key(k.as_str()) {
                continue;
            }
            match vocab.axes.iter_mut().find(|(n, _)| n == k) {
                Some((_, vals)) => {
                    if !vals.iter().any(|w| value_eq(v, w)) {
                        vals.push(v.clone());
                    }
                }
                None => vocab.axes.push((k.clone(), vec![v.clone()])),
            }
        }
    }
    vocab
}

/// The error for the cell at `position` whose id the cell at `earlier` already has
/// (positions among the cells that survived the rules, counted from 0).
fn duplicate_id(src: &Source, id: &CellId, earlier: usize, position: usize) -> MatrixError {
    src.error_at(
        "axes",
        format!(
            "duplicate cell id `{id}` (cells #{} and #{}): axis values that differ only in such characters give the same id (characters outside [A-Za-z0-9._+-] become `_`); rename one",
            earlier + 1,
            position + 1
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::parse::parse_str;
    use std::path::Path;

    fn expand_str(yaml: &str) -> Result<Expanded, MatrixError> {
        let (spec, src) = parse_str(Path::new("t.yaml"), yaml.to_string())?;
        expand(&spec, &src)
    }

    /// Cells as `key=value` lists (values in cell order), for readable assertions.
    fn rows(e: &Expanded) -> Vec<String> {
        e.cells
            .iter()
            .map(|c| {
                c.values
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect()
    }

    #[test]
    fn github_include_example() {
        // docs.github.com "Expanding or adding matrix configurations", example 1.
        let e = expand_str(
            r#"
axes:
  fruit: [apple, pear]
  animal: [cat, dog]
include:
  - color: green
  - color: pink
    animal: cat
  - fruit: apple
    shape: circle
  - fruit: banana
  - fruit: banana
    animal: cat
"#,
        )
        .unwrap();
        assert_eq!(
            rows(&e),
            vec![
                "fruit=apple,animal=cat,color=pink,shape=circle",
                "fruit=apple,animal=dog,color=green,shape=circle",
                "fruit=pear,animal=cat,color=pink",
                "fruit=pear,animal=dog,color=green",
                "fruit=banana",
                "fruit=banana,animal=cat",
            ]
        );
    }

    #[test]
    fn github_include_extends_one_job() {
        // docs.github.com example: node 16 on windows gets npm 6; others unchanged.
        let e = expand_str(
            "axes:\n  os: [windows-latest, ubuntu-latest]\n  node: [14, 16]\ninclude:\n  - os: windows-latest\n    node: 16\n    npm: 6\n",
        )
        .unwrap();
        assert_eq!(
            rows(&e),
            vec![
                "os=windows-latest,node=14",
                "os=windows-latest,node=16,npm=6",
                "os=ubuntu-latest,node=14",
                "os=ubuntu-latest,node=16",
            ]
        );
    }

    #[test]
    fn github_exclude_example_partial_match() {
        // docs.github.com "Excluding matrix configurations": 12 - 1 - 2 = 9 jobs.
        let e = expand_str(
            r#"
axes:
  os: [macos-latest, windows-latest]
  version: [12, 14, 16]
  environment: [staging, production]
rules:
  - exclude: {os: macos-latest, version: 12, environment: production}
    reason: a
  - exclude: {os: windows-latest, version: 16}
    reason: b
"#,
        )
        .unwrap();
        assert_eq!(e.combinations, 12);
        assert_eq!(e.cells.len(), 9);
        assert_eq!(e.dropped.len(), 3);
        assert_eq!(e.dropped[0].reason, "a");
        assert!(e.dropped[1..].iter().all(|d| d.reason == "b"));
    }

    #[test]
    fn include_adds_back_an_excluded_cell() {
        let e = expand_str(
            "axes:\n  a: [x, y]\nrules:\n  - exclude: {a: y}\n    reason: r\ninclude:\n  - a: y\n",
        )
        .unwrap();
        assert_eq!(rows(&e), vec!["a=x", "a=y"]);
        assert_eq!(e.dropped.len(), 1);
    }

    #[test]
    fn include_sets_parameters_without_changing_ids() {
        let e = expand_str(
            "axes:\n  model: [a, b]\ndefaults:\n  micro_batch: 4\ninclude:\n  - model: b\n    micro_batch: 2\n",
        )
        .unwrap();
        assert_eq!(e.cells[1].id.as_str(), "b");
        assert_eq!(e.cells[1].params.micro_batch, 2);
        assert_eq!(e.cells[0].params.micro_batch, 4);
    }

    #[test]
    fn order_is_first_axis_slowest_and_subsets_smallest_first() {
        let e =
            expand_str("axes:\n  m: [a, b]\n  features: {subsets_of: [compile, sac]}\n").unwrap();
        let ids: Vec<&str> = e.cells.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "a.base",
                "a.compile",
                "a.sac",
                "a.compile+sac",
                "b.base",
                "b.compile",
                "b.sac",
                "b.compile+sac"
            ]
        );
    }

    #[test]
    fn zip_advances_in_lockstep() {
        let e = expand_str(
            "axes:\n  gpus: [1, 2, 8]\n  model: [a, b]\n  global_batch: [8, 16, 64]\nzip: [[gpus, global_batch]]\ndefaults: {micro_batch: 8}\n",
        )
        .unwrap();
        assert_eq!(e.combinations, 6);
        assert_eq!(
            rows(&e),
            vec![
                "gpus=1,model=a,global_batch=8",
                "gpus=1,model=b,global_batch=8",
                "gpus=2,model=a,global_batch=16",
                "gpus=2,model=b,global_batch=16",
                "gpus=8,model=a,global_batch=64",
                "gpus=8,model=b,global_batch=64",
            ]
        );
        // The zipped axis sets the parameter; grad_accum follows from it.
        assert_eq!(e.cells[5].params.global_batch, 64);
        assert_eq!(e.cells[5].params.grad_accum, 1);
        assert_eq!(e.cells[0].params.grad_accum, 1);
    }

    #[test]
    fn zip_errors() {
        let e = expand_str("axes:\n  a: [1, 2]\n  b: [1]\nzip: [[a, b]]\n").unwrap_err();
        assert!(e.to_string().starts_with("t.yaml:4:11:"), "{e}");
        assert!(e.to_string().contains("same number of values"), "{e}");
        let e = expand_str("axes:\n  a: [1, 2]\nzip: [[a, c]]\n").unwrap_err();
        assert!(e.to_string().contains("unknown axis `c`"), "{e}");
    }

    #[test]
    fn each_rule_kind() {
        let e = expand_str(
            r#"
axes:
  dtype: [bf16, fp8]
  gpus: [1, 8]
  parallel: [single, fsdp]
  features: {subsets_of: [compile, sac]}
rules:
  - incompatible: [compile, fp8]
    reason: compile+fp8
  - when: parallel=single and gpus>1
    reason: single is one gpu
  - requires: {if: "has(sac)", then: {parallel: fsdp}}
    reason: sac needs fsdp
  - exclude: {parallel: fsdp, gpus: 1}
    reason: fsdp needs gpus
"#,
        )
        .unwrap();
        let by = |id: &str| {
            e.dropped
                .iter()
                .find(|d| d.cell.id.as_str() == id)
                .map(|d| d.reason.clone())
        };
        assert_eq!(
            by("fp8.1gpu.single.compile").as_deref(),
            Some("compile+fp8")
        );
        assert_eq!(
            by("bf16.8gpu.single.base").as_deref(),
            Some("single is one gpu")
        );
        assert_eq!(
            by("bf16.1gpu.single.sac").as_deref(),
            Some("sac needs fsdp")
        );
        assert_eq!(
            by("bf16.1gpu.fsdp.base").as_deref(),
            Some("fsdp needs gpus")
        );
        assert!(e
            .cells
            .iter()
            .any(|c| c.id.as_str() == "bf16.8gpu.fsdp.compile+sac"));
        assert!(e
            .cells
            .iter()
            .any(|c| c.id.as_str() == "bf16.1gpu.single.compile"));
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
        assert_eq!(e.cells.len() + e.dropped.len(), 32);
    }

    #[test]
    fn exclude_alternatives_on_scalar_axes() {
        let e = expand_str(
            "axes:\n  m: [a, b, c]\n  g: [1, 2, 4]\nrules:\n  - exclude: {m: [a, b], g: [2, 4]}\n    reason: r\n",
        )
        .unwrap();
        assert_eq!(e.dropped.len(), 4);
    }

    #[test]
    fn rule_matching_nothing_warns_with_location() {
        let e = expand_str("axes:\n  m: [a, b]\nrules:\n  - exclude: {m: a}\n    reason: x\n  - when: m=b and m=a\n    reason: never\n").unwrap();
        assert_eq!(e.warnings.len(), 1);
        assert!(
            e.warnings[0].starts_with("t.yaml:6:5: rules[1]"),
            "{:?}",
            e.warnings
        );
    }

    #[test]
    fn overrides_and_derived_values() {
        let e = expand_str(
            "axes:\n  model: [small, big]\n  gpus: [1, 4]\ndefaults: {micro_batch: 8, grad_accum: 2, timeout: 10m}\noverrides:\n  model:\n    big: {micro_batch: 2, timeout: 1h}\n",
        )
        .unwrap();
        let big4 = e
            .cells
            .iter()
            .find(|c| c.id.as_str() == "big.4gpu")
            .unwrap();
        assert_eq!(big4.params.micro_batch, 2);
        assert_eq!(big4.params.global_batch, 4 * 2 * 2);
        assert_eq!(big4.params.timeout_s, 3600);
        let small1 = &e.cells[0];
        assert_eq!(small1.params.global_batch, 16);
        assert_eq!(small1.params.timeout_s, 600);
    }

    #[test]
    fn global_batch_that_does_not_divide_is_an_error() {
        let e = expand_str("axes:\n  gpus: [1, 3]\ndefaults: {global_batch: 8, micro_batch: 2}\n")
            .unwrap_err();
        assert!(e.to_string().contains("not a multiple"), "{e}");
        assert!(e.to_string().starts_with("t.yaml:3:"), "{e}");
    }

    #[test]
    fn located_semantic_errors() {
        let cases = [
            ("axes:\n  m: []\n", "t.yaml:2:3:", "has no values"),
            (
                "axes:\n  m: [a, b, a]\n",
                "t.yaml:2:13:",
                "duplicate value `a`",
            ),
            ("axes: {}\n", "t.yaml:1:1:", "`axes` is empty"),
            (
                "axes:\n  m: [a]\nrules:\n  - exclude: {gpu: 8}\n    reason: r\n",
                "t.yaml:4:15:",
                "unknown axis `gpu`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - exclude: {m: z}\n    reason: r\n",
                "t.yaml:4:15:",
                "no value `z`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - when: m=zz\n    reason: r\n",
                "t.yaml:4:13:",
                "no value `zz`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - when: \"m=a and gpu>1\"\n    reason: r\n",
                "t.yaml:4:20:",
                "unknown axis or parameter `gpu`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - incompatible: [a, fp8]\n    reason: r\n",
                "t.yaml:4:23:",
                "unknown flag `fp8`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - exclude: {m: a}\n    when: m=a\n    reason: r\n",
                "t.yaml:4:5:",
                "exactly one of",
            ),
            (
                "axes:\n  m: [a]\noverrides:\n  m:\n    b: {steps: 3}\n",
                "t.yaml:5:5:",
                "no value `b`",
            ),
            (
                "axes:\n  m: [a]\noverrides:\n  m:\n    a: {timeout: soon}\n",
                "t.yaml:5:9:",
                "not a duration",
            ),
            (
                "axes:\n  gpus: [one]\n",
                "t.yaml:2:10:",
                "an integer from 0 to 1048576",
            ),
            (
                "axes:\n  parallel: [single, zero3]\n",
                "t.yaml:2:22:",
                "one of single, ddp, fsdp",
            ),
            (
                "axes:\n  features: [compile, sac]\n",
                "t.yaml:2:3:",
                "set-valued axis",
            ),
            (
                "axes:\n  m: [a]\ndefaults: {steps: 5, warmup: 5}\n",
                "t.yaml:3:22:",
                "warmup (5) must be less than steps",
            ),
            (
                "axes:\n  m: [a/b, a:b]\n",
                "t.yaml:1:1:",
                "duplicate cell id `a_b`",
            ),
        ];
        for (yaml, loc, msg) in cases {
            let e = expand_str(yaml).expect_err(yaml);
            let s = e.to_string();
            assert!(s.starts_with(loc), "expected {loc} for {yaml:?}, got:\n{s}");
            assert!(s.contains(msg), "expected {msg:?} for {yaml:?}, got:\n{s}");
            assert!(s.contains('^'), "no caret for {yaml:?}:\n{s}");
        }
    }
}
