//! The expansion as it was before [`super::plan`]: every cell of the product built and
//! kept, then include, then ids. Kept for the tests only, which check that the plan gives
//! the same cells, drops, warnings and errors on every matrix they try.

use std::collections::{HashMap, HashSet};

use indexmap::IndexMap;
use itertools::Itertools;

use super::params::ParamBuilder;
use super::rules::{compile_rules, rule_label, CompiledRule};
use super::validate::{check_cell_values, validate_axes, validate_overrides};
use super::{dimensions, filter_vocabulary, value_eq, vocabulary, Draft, Expanded};
use crate::cell::{Cell, CellId, Value};
use crate::matrix::budget::Budget;
use crate::matrix::parse::Source;
use crate::matrix::spec::{MatrixSpec, PARAM_NAMES};
use crate::matrix::{Dropped, MatrixError};

fn build(
    builder: &ParamBuilder,
    values: IndexMap<String, Value>,
    include_params: &[(String, Value)],
) -> Result<Cell, MatrixError> {
    let id = CellId::from_values(&values);
    let params = builder.params(&values, &id, include_params)?;
    Ok(Cell { id, values, params })
}

fn lenient(builder: &ParamBuilder, values: IndexMap<String, Value>) -> Cell {
    Cell {
        id: CellId::from_values(&values),
        values,
        params: builder.base().clone(),
    }
}

/// Expands `spec` into cells, refusing it before any value is generated when it would
/// exceed `budget` (see [`super::budget`]).
pub(crate) fn expand_within(
    spec: &MatrixSpec,
    src: &Source,
    budget: Budget,
) -> Result<Expanded, MatrixError> {
    crate::matrix::budget::check(spec, src, budget)?;
    let axes = validate_axes(spec, src)?;
    let axis_index: HashMap<&str, usize> = axes
        .iter()
        .enumerate()
        .map(|(i, a)| (a.name.as_str(), i))
        .collect();
    let set_axes: HashSet<String> = axes
        .iter()
        .filter(|a| a.is_set)
        .map(|a| a.name.clone())
        .collect();
    let dims = dimensions(spec, src, &axes, &axis_index)?;
    validate_overrides(spec, src, &axes, &axis_index)?;
    let vocab = vocabulary(spec, &axes);
    let rules = compile_rules(spec, src, &axes, &axis_index, &vocab)?;
    let builder = ParamBuilder::new(spec, src)?;

    // The product, first dimension slowest.
    let combinations: usize = dims.iter().map(Vec::len).product();
    let mut kept: Vec<Draft> = Vec::new();
    let mut dropped = Vec::new();
    let mut rule_hits = vec![0usize; rules.len()];
    for combo in dims.iter().map(|d| d.iter()).multi_cartesian_product() {
        let mut picked: Vec<(usize, usize)> = combo.into_iter().flatten().copied().collect();
        picked.sort_unstable();
        let values: IndexMap<String, Value> = picked
            .iter()
            .map(|&(a, v)| (axes[a].name.clone(), axes[a].values[v].clone()))
            .collect();
        // A cell that a rule drops may have parameters that do not derive (e.g. a global
        // batch that its GPU count does not divide); rules still see it, with the
        // parameters as far as they resolve, and only kept cells must derive cleanly.
        let cell = build(&builder, values.clone(), &[])
            .unwrap_or_else(|_| lenient(&builder, values.clone()));
        let mut first: Option<&CompiledRule> = None;
        for (i, r) in rules.iter().enumerate() {
            if r.matcher.matches(&cell, &set_axes) {
                rule_hits[i] += 1;
                first.get_or_insert(r);
            }
        }
        match first {
            Some(r) => dropped.push(Dropped {
                by: rule_label(r),
                reason: r.rule.reason.clone(),
                cell,
            }),
            // A framework adapter drops what its framework cannot express, like a rule.
            None => match crate::external::unexpressible(&cell) {
                Some((by, reason)) => dropped.push(Dropped { by, reason, cell }),
                None => kept.push((values, Vec::new())),
            },
        }
    }
    // Dimensions are never empty (validated), so the product always has a first element;
    // `multi_cartesian_product` of zero dimensions yields nothing, which cannot happen as a
    // matrix has at least one axis.

    let mut warnings = Vec::new();
    for (r, hits) in rules.iter().zip(&rule_hits) {
        if *hits == 0 {
            let path = format!("rules[{}]", r.index);
            let loc = match src.key_pos(&path) {
                Some(p) => format!("{}:{}:{}: ", src.path.display(), p.line, p.column),
                None => format!("{}: ", src.path.display()),
            };
            warnings.push(format!("{loc}{} matches no cell", rule_label(r)));
        }
    }

    apply_include(spec, &axis_index, &mut kept);

    let mut cells = Vec::with_capacity(kept.len());
    for (values, include_params) in kept {
        let cell = build(&builder, values, &include_params)?;
        check_cell_values(&cell, &axes, src)?;
        cells.push(cell);
    }
    check_unique_ids(&cells, src)?;

    let vocab = filter_vocabulary(vocab, spec, &axis_index);
    Ok(Expanded {
        cells,
        dropped,
        warnings,
        vocab,
        combinations,
    })
}

/// GitHub Actions `include`: extend matching original cells without overwriting original
/// values; an entry that matches no original cell becomes a new cell. Cells added by
/// include are never matched by later entries (as in GitHub Actions).
fn apply_include(spec: &MatrixSpec, axis_index: &HashMap<&str, usize>, kept: &mut Vec<Draft>) {
    let originals = kept.len();
    for entry in &spec.include {
        let mut matched = false;
        for (values, params) in kept.iter_mut().take(originals) {
            let fits = entry
                .iter()
                .filter(|(k, _)| axis_index.contains_key(k.as_str()))
                .all(|(k, v)| values.get(k).is_some_and(|w| value_eq(v, w)));
            if !fits {
                continue;
            }
            matched = true;
            for (k, v) in entry {
                if axis_index.contains_key(k.as_str()) {
                    continue;
                }
                if PARAM_NAMES.contains(&k.as_str()) {
                    params.retain(|(n, _)| n != k);
                    params.push((k.clone(), v.clone()));
                } else {
                    values.insert(k.clone(), v.clone());
                }
            }
        }
        if !matched {
            // New cell: declared axes first in axis order, then other keys in entry order,
            // so its id reads like the others'.
            let mut values: IndexMap<String, Value> = IndexMap::new();
            let mut params = Vec::new();
            let mut axis_keys: Vec<(&String, &Value)> = entry
                .iter()
                .filter(|(k, _)| axis_index.contains_key(k.as_str()))
                .collect();
            axis_keys.sort_by_key(|(k, _)| axis_index[k.as_str()]);
            for (k, v) in axis_keys {
                values.insert(k.clone(), v.clone());
            }
            for (k, v) in entry {
                if axis_index.contains_key(k.as_str()) {
                    continue;
                }
                if PARAM_NAMES.contains(&k.as_str()) {
                    params.push((k.clone(), v.clone()));
                } else {
                    values.insert(k.clone(), v.clone());
                }
            }
            kept.push((values, params));
        }
    }
}

fn check_unique_ids(cells: &[Cell], src: &Source) -> Result<(), MatrixError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, c) in cells.iter().enumerate() {
        if let Some(j) = seen.insert(c.id.as_str(), i) {
            return Err(src.error_at(
                "axes",
                format!(
                    "duplicate cell id `{}` (cells #{} and #{}): axis values that differ only in such characters give the same id (characters outside [A-Za-z0-9._+-] become `_`); rename one",
                    c.id,
                    j + 1,
                    i + 1
                ),
            ));
        }
    }
    Ok(())
}

/// The plan against the expansion above, filters applied as `from_spec_within` applied
/// them after it: equal cells, drops, warnings and counts, or the same error.
mod equivalence {
    use std::path::Path;

    use crate::matrix::budget::Budget;
    use crate::matrix::expand::plan::Plan;
    use crate::matrix::filter::Filter;
    use crate::matrix::parse::parse_str;
    use crate::matrix::{Dropped, MatrixError};

    type Outcome = (usize, Vec<crate::cell::Cell>, Vec<Dropped>, Vec<String>);

    fn old(yaml: &str, filters: &[&str]) -> Result<Outcome, String> {
        let (spec, src) = parse_str(Path::new("t.yaml"), yaml.to_string()).unwrap();
        let e = super::expand_within(&spec, &src, Budget::default()).map_err(|e| e.to_string())?;
        let compiled = filters
            .iter()
            .map(|f| Filter::parse(f, &e.vocab).map_err(MatrixError::Filter))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut cells = Vec::new();
        let mut dropped = e.dropped;
        for cell in e.cells {
            match compiled.iter().find(|f| !f.matches(&cell)) {
                None => cells.push(cell),
                Some(f) => dropped.push(Dropped {
                    cell,
                    by: format!("--filter '{}'", f.source()),
                    reason: "not selected by the filter".to_string(),
                }),
            }
        }
        Ok((e.combinations, cells, dropped, e.warnings))
    }

    fn new(yaml: &str, filters: &[&str]) -> Result<Outcome, String> {
        let (spec, src) = parse_str(Path::new("t.yaml"), yaml.to_string()).unwrap();
        let filters: Vec<String> = filters.iter().map(|f| f.to_string()).collect();
        let plan = Plan::new(&spec, &src, Budget::default(), &filters, &mut |_| Ok(()))
            .map_err(|e| e.to_string())?;
        let cells: Vec<_> = plan.cells().collect();
        let dropped: Vec<_> = plan.dropped().collect();
        assert_eq!(plan.run, cells.len());
        assert_eq!(
            plan.dropped_by_rules + plan.dropped_by_filters,
            dropped.len()
        );
        let mut listing = Vec::new();
        plan.each_dropped(|id, values, by, reason| {
            listing.push((
                id.clone(),
                values.clone(),
                by.to_string(),
                reason.to_string(),
            ));
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(listing.len(), dropped.len());
        for (d, l) in dropped.iter().zip(&listing) {
            assert_eq!((&d.cell.id, &d.cell.values), (&l.0, &l.1));
            assert_eq!((&d.by, &d.reason), (&l.2, &l.3));
        }
        let mut visited = Vec::new();
        plan.each_cell(|c| {
            visited.push(c.clone());
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(visited, cells);
        let longest = cells.iter().map(|c| c.id.as_str().len()).max().unwrap_or(0);
        assert_eq!(plan.longest_id, longest);
        Ok((plan.combinations, cells, dropped, plan.warnings.clone()))
    }

    fn same(yaml: &str, filters: &[&str]) {
        assert_eq!(
            new(yaml, filters),
            old(yaml, filters),
            "{yaml}\nfilters {filters:?}"
        );
    }

    #[test]
    fn the_shipped_matrices_and_the_showcase() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<_> = std::fs::read_dir(root.join("matrix"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.push(root.join("tests/fixtures/matrix/showcase.yaml"));
        for f in files {
            let yaml = std::fs::read_to_string(&f).unwrap();
            same(&yaml, &[]);
            same(&yaml, &["fsdp"]);
            same(&yaml, &["gpus>=2", "not has(sac)"]);
        }
    }

    #[test]
    fn include_rules_ids_and_errors() {
        let cases = [
            // GitHub's include example, extended and added cells, a filter on an added key.
            "axes:\n  fruit: [apple, pear]\n  animal: [cat, dog]\ninclude:\n  - color: green\n  - color: pink\n    animal: cat\n  - fruit: apple\n    shape: circle\n  - fruit: banana\n  - fruit: banana\n    animal: cat\n",
            // A parameter set by two entries: the later one wins.
            "axes:\n  m: [a, b]\ninclude:\n  - m: a\n    steps: 9\n  - {steps: 7}\n  - m: b\n    seed: 3\n",
            // A rule drops a cell whose parameters do not derive; a kept one derives.
            "axes:\n  gpus: [1, 3]\ndefaults: {global_batch: 8, micro_batch: 2}\nrules:\n  - exclude: {gpus: 3}\n    reason: r\n",
            // A kept cell whose parameters do not derive: the error.
            "axes:\n  gpus: [1, 3, 5]\ndefaults: {global_batch: 8, micro_batch: 2}\n",
            // Duplicate ids, among the product and with an added cell.
            "axes:\n  m: [a/b, a:b]\n",
            "axes:\n  m: [x, y]\ninclude:\n  - {m: z, n: 1}\n  - {m: x_, n: 1}\n  - {m: z, n: '1'}\n",
            // A duplicate id and a later cell whose parameters fail: the parameters first.
            "axes:\n  m: [a/b, a:b]\n  gpus: [1, 3]\ndefaults: {global_batch: 4}\n",
            // Include adds a bad typed value and an out-of-range gpus count.
            "axes:\n  dtype: [bf16]\ninclude:\n  - {dtype: fp16}\n",
            "axes:\n  gpus: [1]\ninclude:\n  - {gpus: 4294967296}\n",
            // Every rule kind, one matching nothing, zips and overrides.
            "axes:\n  model: [a, b]\n  gpus: [1, 2, 8]\n  global_batch: [8, 16, 64]\n  parallel: [single, fsdp]\n  features: {subsets_of: [compile, sac]}\nzip: [[gpus, global_batch]]\ndefaults: {micro_batch: 8}\noverrides:\n  model:\n    b: {micro_batch: 1, timeout: 1h}\nrules:\n  - incompatible: [compile, sac]\n    reason: a\n  - when: parallel=single and gpus>1\n    reason: b\n  - requires: {if: \"has(sac)\", then: {parallel: fsdp}}\n    reason: c\n  - exclude: {model: [a], gpus: [2, 8]}\n    reason: d\n  - when: model=a and model=b\n    reason: never\n",
        ];
        for yaml in cases {
            same(yaml, &[]);
            same(yaml, &["gpus>1 or model~a"]);
            same(yaml, &["not id~z", "m!=y"]);
        }
    }

    #[test]
    fn filter_errors_rank_after_expansion_errors() {
        same("axes:\n  m: [a/b, a:b]\n", &["nosuch=1"]);
        same("axes:\n  m: [a, b]\n", &["nosuch=1"]);
        same("axes:\n  m: [a, b]\n", &["m=a", "(("]);
    }
}
