//! The product walked once to decide each combination's fate, then walked again to hand
//! out the cells, so that a matrix of a million combinations never holds a million cells.
//!
//! A [`Plan`] keeps, per combination of the product, only what became of it (a [`Fate`]:
//! run, or dropped by which rule, adapter or filter), plus the few cells `include` adds.
//! [`Plan::each_cell`] and [`Plan::each_dropped`] rebuild the cells from their
//! combinations' indices when asked, in the documented order, so `bench matrix --dry-run`
//! writes each cell as it is rebuilt; [`Plan::cells`] and [`Plan::dropped`] hand them out
//! one by one for `matrix::load_within` to collect for a run. Both paths go through this
//! one walk, so what a dry run shows is what a run runs.
//!
//! The first walk does every check in the order the stages are documented: a cell's
//! parameters and typed values (in cell order), then unique ids, then the filters, then the
//! caller's check of the cells that run (a built-in model that does not exist); so the first
//! error reported is the one a walk that built every cell first would report.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;

use indexmap::IndexMap;

use super::params::ParamBuilder;
use super::rules::{compile_rules, rule_label, CompiledRule};
use super::validate::{check_cell_values, validate_axes, validate_overrides};
use super::{dimensions, filter_vocabulary, value_eq, vocabulary, Axis, Dimension, Draft};
use crate::cell::{Cell, CellId, Value};
use crate::matrix::budget::Budget;
use crate::matrix::filter::{Filter, Vocabulary};
use crate::matrix::parse::Source;
use crate::matrix::spec::{MatrixSpec, PARAM_NAMES};
use crate::matrix::{Dropped, MatrixError};
use crate::results::FILTER_DROP_PREFIX;

/// What became of one cell of the product (or one cell `include` added).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It runs.
    Run,
    /// Dropped by the rule of this index (into the compiled rules, in file order).
    Rule(u32),
    /// Dropped by its framework adapter, for the reason of this index.
    Adapter(u32),
    /// Not selected by the filter of this index.
    Filter(u32),
}

impl Fate {
    fn by_rules(self) -> bool {
        matches!(self, Fate::Rule(_) | Fate::Adapter(_))
    }
}

/// Checks each cell that will run; the first error is reported after every check of the
/// expansion itself (see the module docs).
pub(crate) type RunCheck<'c> = dyn FnMut(&Cell) -> Result<(), MatrixError> + 'c;

/// The expansion of a matrix, cells kept as their fates (see the module docs).
pub(crate) struct Plan<'a> {
    spec: &'a MatrixSpec,
    axes: Vec<Axis>,
    /// Axis name -> index in `axes`.
    axis_index: HashMap<String, usize>,
    set_axes: HashSet<String>,
    dims: Vec<Dimension>,
    /// The id fragment of every value of every axis, made once.
    fragments: Vec<Vec<String>>,
    rules: Vec<CompiledRule<'a>>,
    builder: ParamBuilder<'a>,
    filters: Vec<Filter>,
    /// `--filter '...'` for each filter, as [`Dropped::by`] says it.
    filter_labels: Vec<String>,
    /// `rules[i] kind (name)` for each rule.
    rule_labels: Vec<String>,
    /// (by, reason) of each framework adapter's drop, in order of first appearance.
    adapter_labels: Vec<(String, String)>,
    /// One fate per combination of the product, in product order.
    fates: Vec<Fate>,
    /// Cells `include` added (values and parameters), in entry order, with their fates.
    added: Vec<(Draft, Fate)>,
    pub(crate) combinations: usize,
    pub(crate) warnings: Vec<String>,
    /// What filters may name.
    pub(crate) vocab: Vocabulary,
    /// Cells that run.
    pub(crate) run: usize,
    /// Cells dropped by rules (and framework adapters).
    pub(crate) dropped_by_rules: usize,
    /// Cells dropped by filters.
    pub(crate) dropped_by_filters: usize,
    /// The longest id of a cell that runs, in bytes.
    pub(crate) longest_id: usize,
}

/// Hashes the 64-bit hash of an id to itself: the map of ids seen holds hashes, which need
/// no second hashing.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A 64-bit hash of an id: FNV-1a, which needs no key (the map holds ids of one matrix,
/// and two ids with one hash are compared whole) and is several times cheaper than SipHash
/// on ids of a few dozen bytes.
fn id_hash(id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in id.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The ids of the cells seen so far, to find the first id used twice: 64-bit hashes, each
/// with the cell's position, so a million ids take about 32 MB instead of their text.
/// Two ids with one hash are told apart by rebuilding the earlier cell's id (see
/// [`Plan::id_at`]); ids whose hash another id already has are kept whole in `spill`.
#[derive(Default)]
struct SeenIds {
    by_hash: HashMap<u64, usize, BuildHasherDefault<IdentityHasher>>,
    spill: HashMap<String, usize>,
}

impl<'a> Plan<'a> {
    /// Expands `spec` within `budget`, applies `filters` (combined with `and`) and calls
    /// `run_check` on each cell that runs until it fails.
    pub(crate) fn new(
        spec: &'a MatrixSpec,
        src: &'a Source,
        budget: Budget,
        filters: &[String],
        run_check: &mut RunCheck<'_>,
    ) -> Result<Plan<'a>, MatrixError> {
        crate::matrix::budget::check(spec, src, budget)?;
        let axes = validate_axes(spec, src)?;
        let by_name: HashMap<&str, usize> = axes
            .iter()
            .enumerate()
            .map(|(i, a)| (a.name.as_str(), i))
            .collect();
        let dims = dimensions(spec, src, &axes, &by_name)?;
        validate_overrides(spec, src, &axes, &by_name)?;
        let rule_vocab = vocabulary(spec, &axes);
        let rules = compile_rules(spec, src, &axes, &by_name, &rule_vocab)?;
        let builder = ParamBuilder::new(spec, src)?;
        let vocab = filter_vocabulary(rule_vocab, spec, &by_name);
        // Filters are parsed now to be applied during the walk, but a bad one is reported
        // only after the expansion's own errors, as the stages run in that order.
        let filters: Result<Vec<Filter>, MatrixError> = filters
            .iter()
            .map(|f| Filter::parse(f, &vocab).map_err(MatrixError::Filter))
            .collect();
        let axis_index = by_name.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let fragments = axes
            .iter()
            .map(|a| {
                a.values
                    .iter()
                    .map(|v| crate::cell::fragment(&a.name, v))
                    .collect()
            })
            .collect();
        let mut plan = Plan {
            spec,
            set_axes: axes
                .iter()
                .filter(|a| a.is_set)
                .map(|a| a.name.clone())
                .collect(),
            axes,
            axis_index,
            combinations: dims.iter().map(Vec::len).product(),
            dims,
            fragments,
            rule_labels: rules.iter().map(rule_label).collect(),
            rules,
            builder,
            filter_labels: filters
                .as_ref()
                .map(|fs| {
                    fs.iter()
                        .map(|f| format!("{FILTER_DROP_PREFIX} '{}'", f.source()))
                        .collect()
                })
                .unwrap_or_default(),
            filters: Vec::new(),
            adapter_labels: Vec::new(),
            fates: Vec::new(),
            added: Vec::new(),
            warnings: Vec::new(),
            vocab,
            run: 0,
            dropped_by_rules: 0,
            dropped_by_filters: 0,
            longest_id: 0,
        };
        let filter_error = match filters {
            Ok(fs) => {
                plan.filters = fs;
                None
            }
            Err(e) => Some(e),
        };
        let mut late = LateErrors::default();
        let hits = plan.walk(src, run_check, &mut late)?;
        plan.rule_warnings(src, &hits);
        if let Some(e) = late.duplicate.or(filter_error).or(late.run_check) {
            return Err(e);
        }
        Ok(plan)
    }

    /// The value index of each axis in combination `i` (first dimension slowest).
    fn decode(&self, mut i: usize, choice: &mut [usize]) {
        for dim in self.dims.iter().rev() {
            let n = dim.len();
            for &(a, v) in &dim[i % n] {
                choice[a] = v;
            }
            i /= n;
        }
    }

    /// The cell of the product with value indices `choice`, as the rules see it, and
    /// whether its parameters resolve. A cell that a rule drops may have parameters that
    /// do not derive (e.g. a global batch its GPU count does not divide); rules still see
    /// it, with the default parameters, and only kept cells must derive cleanly.
    fn product_cell(&self, choice: &[usize]) -> (Cell, Result<(), MatrixError>) {
        let (id, values) = self.product_values(choice);
        let (params, ok) = match self.builder.params(&values, &id, &[]) {
            Ok(p) => (p, Ok(())),
            Err(e) => (self.builder.base().clone(), Err(e)),
        };
        (Cell { id, values, params }, ok)
    }

    /// The id and values of the combination with value indices `choice`; the id is joined
    /// from fragments made once per axis value.
    fn product_values(&self, choice: &[usize]) -> (CellId, IndexMap<String, Value>) {
        let mut values = IndexMap::with_capacity(self.axes.len());
        for (a, &v) in choice.iter().enumerate() {
            values.insert(self.axes[a].name.clone(), self.axes[a].values[v].clone());
        }
        let id = CellId::join(
            choice
                .iter()
                .enumerate()
                .map(|(a, &v)| self.fragments[a][v].as_str()),
        );
        (id, values)
    }

    /// The value indices of combination `i`.
    fn choice(&self, i: usize) -> Vec<usize> {
        let mut choice = vec![0usize; self.axes.len()];
        self.decode(i, &mut choice);
        choice
    }

    /// The include entries that extend the kept cell `cell` (GitHub Actions semantics: an
    /// entry whose axis keys all equal the cell's values), applied to it; `matched` marks
    /// them. Returns the cell as it runs, or its parameters' error.
    fn extend(
        &self,
        cell: Cell,
        ok: Result<(), MatrixError>,
        matched: Option<&mut [bool]>,
    ) -> Result<Cell, MatrixError> {
        match self.extension(&cell, matched) {
            None => ok.map(|()| cell),
            Some(extended) => extended,
        }
    }

    /// [`Plan::extend`] without taking the cell: `None` when no entry extends it (the
    /// cell runs as it is).
    fn extension(
        &self,
        cell: &Cell,
        matched: Option<&mut [bool]>,
    ) -> Option<Result<Cell, MatrixError>> {
        let fitting: Vec<usize> = self
            .spec
            .include
            .iter()
            .enumerate()
            .filter(|(_, entry)| {
                entry
                    .iter()
                    .filter(|(k, _)| self.axis_index.contains_key(k.as_str()))
                    .all(|(k, v)| cell.values.get(k).is_some_and(|w| value_eq(v, w)))
            })
            .map(|(e, _)| e)
            .collect();
        if fitting.is_empty() {
            return None;
        }
        if let Some(matched) = matched {
            for &e in &fitting {
                matched[e] = true;
            }
        }
        let mut values = cell.values.clone();
        let mut params: Vec<(String, Value)> = Vec::new();
        for &e in &fitting {
            // Keys that are axes are original and never overwritten; parameters set the
            // cell's parameter (a later entry wins); other keys are added values.
            for (k, v) in &self.spec.include[e] {
                if self.axis_index.contains_key(k.as_str()) {
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
        Some(self.draft_cell((values, params)))
    }

    /// The cell of a draft: values (in order) and parameters set by include.
    fn draft_cell(&self, (values, include_params): Draft) -> Result<Cell, MatrixError> {
        let id = CellId::from_values(&values);
        let params = self.builder.params(&values, &id, &include_params)?;
        Ok(Cell { id, values, params })
    }

    /// A new cell from an include entry that extends no kept cell: the matrix's axes first
    /// in axis order, then its other keys in entry order, so its id reads like the others'.
    fn added_draft(&self, entry: &IndexMap<String, Value>) -> Draft {
        let mut values: IndexMap<String, Value> = IndexMap::new();
        let mut params = Vec::new();
        let mut axis_keys: Vec<(&String, &Value)> = entry
            .iter()
            .filter(|(k, _)| self.axis_index.contains_key(k.as_str()))
            .collect();
        axis_keys.sort_by_key(|(k, _)| self.axis_index[k.as_str()]);
        for (k, v) in axis_keys {
            values.insert(k.clone(), v.clone());
        }
        for (k, v) in entry {
            if self.axis_index.contains_key(k.as_str()) {
                continue;
            }
            if PARAM_NAMES.contains(&k.as_str()) {
                params.push((k.clone(), v.clone()));
            } else {
                values.insert(k.clone(), v.clone());
            }
        }
        (values, params)
    }

    /// A cell to load combinations into (see [`Scratch`]).
    fn scratch(&self) -> Scratch {
        let choice = vec![0usize; self.axes.len()];
        Scratch {
            cell: self.product_cell(&choice).0,
            loaded: choice.clone(),
            choice,
        }
    }

    /// Loads combination `i` into `s`: the values of the axes that changed, the id, and
    /// (when asked) the parameters, whose error it returns; without them, or when they do
    /// not resolve, the cell has the default parameters.
    fn load(&self, s: &mut Scratch, i: usize, with_params: bool) -> Result<(), MatrixError> {
        self.decode(i, &mut s.choice);
        for (a, (&now, was)) in s.choice.iter().zip(s.loaded.iter_mut()).enumerate() {
            if now != *was {
                if let Some((_, v)) = s.cell.values.get_index_mut(a) {
                    *v = self.axes[a].values[now].clone();
                }
                *was = now;
            }
        }
        s.cell.id = CellId::join(
            s.choice
                .iter()
                .enumerate()
                .map(|(a, &v)| self.fragments[a][v].as_str()),
        );
        if !with_params {
            return Ok(());
        }
        match self.builder.params(&s.cell.values, &s.cell.id, &[]) {
            Ok(p) => {
                s.cell.params = p;
                Ok(())
            }
            Err(e) => {
                s.cell.params = self.builder.base().clone();
                Err(e)
            }
        }
    }

    /// Calls `f` with each cell that runs, in order. Cells of the product are loaded into
    /// one [`Scratch`] cell, so writing a listing allocates next to nothing per cell. (The
    /// listings render by blocks with [`Plan::each_cell_in`]; the tests walk it whole.)
    #[cfg(test)]
    pub(crate) fn each_cell<E>(&self, f: impl FnMut(&Cell) -> Result<(), E>) -> Result<(), E> {
        self.each_cell_in(0..self.combinations, true, f)
    }

    /// [`Plan::each_cell`] for the cells of the product whose combination lies in `range`,
    /// then, when `added`, the cells include added: a listing is written by blocks of
    /// combinations, rendered side by side (see `matrix::cmd`).
    pub(crate) fn each_cell_in<E>(
        &self,
        range: Range<usize>,
        added: bool,
        mut f: impl FnMut(&Cell) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut s = self.scratch();
        for i in range {
            if self.fates[i] != Fate::Run {
                continue;
            }
            let ok = self.load(&mut s, i, true);
            match self.extension(&s.cell, None) {
                None => {
                    checked(ok);
                    f(&s.cell)?;
                }
                Some(extended) => f(&checked(extended))?,
            }
        }
        if added {
            for (draft, fate) in &self.added {
                if *fate == Fate::Run {
                    f(&checked(self.draft_cell(draft.clone())))?;
                }
            }
        }
        Ok(())
    }

    /// Calls `f` with the id, values, `by` and `reason` of each dropped cell, in the order
    /// of [`Plan::dropped`]; as [`Plan::each_cell`], without a cell built per call.
    pub(crate) fn each_dropped<E>(
        &self,
        mut f: impl FnMut(&CellId, &IndexMap<String, Value>, &str, &str) -> Result<(), E>,
    ) -> Result<(), E> {
        self.each_dropped_in(true, 0..self.combinations, false, &mut f)?;
        self.each_dropped_in(false, 0..self.combinations, true, &mut f)
    }

    /// The cells rules dropped (`by_rules`) or those filters dropped, among the
    /// combinations in `range` and then, when `added`, among the cells include added, to
    /// `f` as [`Plan::each_dropped`] gives them.
    pub(crate) fn each_dropped_in<E>(
        &self,
        by_rules: bool,
        range: Range<usize>,
        added: bool,
        mut f: impl FnMut(&CellId, &IndexMap<String, Value>, &str, &str) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut s = self.scratch();
        for i in range {
            let fate = self.fates[i];
            if by_rules && fate.by_rules() {
                // The rules saw the cell before include; a listing shows no parameters.
                let _ = self.load(&mut s, i, false);
                let (by, reason) = self.label(fate);
                f(&s.cell.id, &s.cell.values, by, reason)?;
            } else if !by_rules && matches!(fate, Fate::Filter(_)) {
                let ok = self.load(&mut s, i, true);
                let (by, reason) = self.label(fate);
                match self.extension(&s.cell, None) {
                    None => {
                        checked(ok);
                        f(&s.cell.id, &s.cell.values, by, reason)?;
                    }
                    Some(extended) => {
                        let c = checked(extended);
                        f(&c.id, &c.values, by, reason)?;
                    }
                }
            }
        }
        if added && !by_rules {
            for (draft, fate) in &self.added {
                if let Fate::Filter(_) = fate {
                    let c = checked(self.draft_cell(draft.clone()));
                    let (by, reason) = self.label(*fate);
                    f(&c.id, &c.values, by, reason)?;
                }
            }
        }
        Ok(())
    }

    /// The first walk: every combination's fate, the cells include adds, the checks.
    /// Returns which rules matched at least one cell.
    fn walk(
        &mut self,
        src: &Source,
        run_check: &mut RunCheck<'_>,
        late: &mut LateErrors,
    ) -> Result<Vec<bool>, MatrixError> {
        self.fates = Vec::with_capacity(self.combinations);
        let mut hits = vec![false; self.rules.len()];
        let mut matched = vec![false; self.spec.include.len()];
        let mut adapters: HashMap<(String, String), u32> = HashMap::new();
        let mut seen = SeenIds::default();
        let mut position = 0usize;
        // One cell is updated in place from combination to combination (see `Scratch`).
        let mut scratch = self.scratch();
        for i in 0..self.combinations {
            let ok = self.load(&mut scratch, i, true);
            let cell = &scratch.cell;
            let mut fate = Fate::Run;
            for (r, rule) in self.rules.iter().enumerate() {
                // The first rule that matches drops the cell; later rules are still tried
                // while they have matched nothing, for the warning about rules that match
                // no cell.
                if fate != Fate::Run && hits[r] {
                    continue;
                }
                if rule.matcher.matches(cell, &self.set_axes) {
                    hits[r] = true;
                    if fate == Fate::Run {
                        fate = Fate::Rule(r as u32);
                    }
                }
            }
            if fate == Fate::Run {
                // A framework adapter drops what its framework cannot express, like a rule.
                if let Some(label) = crate::external::unexpressible(cell) {
                    let next = adapters.len() as u32;
                    let k = *adapters.entry(label.clone()).or_insert_with(|| {
                        self.adapter_labels.push(label);
                        next
                    });
                    fate = Fate::Adapter(k);
                }
            }
            if fate != Fate::Run {
                self.dropped_by_rules += 1;
                self.fates.push(fate);
                continue;
            }
            let extended = match self.extension(cell, Some(&mut matched)) {
                None => {
                    ok?;
                    None
                }
                Some(extended) => Some(extended?),
            };
            let fate = self.settle(
                extended.as_ref().unwrap_or(cell),
                position,
                src,
                &mut seen,
                run_check,
                late,
            )?;
            self.fates.push(fate);
            position += 1;
        }
        for (e, entry) in self.spec.include.iter().enumerate() {
            if matched[e] {
                continue;
            }
            let draft = self.added_draft(entry);
            let cell = self.draft_cell(draft.clone())?;
            let fate = self.settle(&cell, position, src, &mut seen, run_check, late)?;
            self.added.push((draft, fate));
            position += 1;
        }
        Ok(hits)
    }

    /// The checks of a cell that survived the rules, at `position` among those cells, and
    /// its fate under the filters.
    fn settle(
        &mut self,
        cell: &Cell,
        position: usize,
        src: &Source,
        seen: &mut SeenIds,
        run_check: &mut RunCheck<'_>,
        late: &mut LateErrors,
    ) -> Result<Fate, MatrixError> {
        check_cell_values(cell, &self.axes, src)?;
        if late.duplicate.is_none() {
            if let Some(earlier) = self.seen_before(seen, cell.id.as_str(), position) {
                late.duplicate = Some(super::duplicate_id(src, &cell.id, earlier, position));
            }
        }
        match self.filters.iter().position(|f| !f.matches(cell)) {
            Some(f) => {
                self.dropped_by_filters += 1;
                Ok(Fate::Filter(f as u32))
            }
            None => {
                self.run += 1;
                self.longest_id = self.longest_id.max(cell.id.as_str().len());
                if late.run_check.is_none() {
                    late.run_check = run_check(cell).err();
                }
                Ok(Fate::Run)
            }
        }
    }

    /// The position of the earlier cell with id `id`, if any; records `id` at `position`.
    fn seen_before(&self, seen: &mut SeenIds, id: &str, position: usize) -> Option<usize> {
        use std::collections::hash_map::Entry;
        match seen.by_hash.entry(id_hash(id)) {
            Entry::Vacant(v) => {
                v.insert(position);
                None
            }
            Entry::Occupied(o) => {
                let earlier = *o.get();
                if self.id_at(earlier).as_deref() == Some(id) {
                    return Some(earlier);
                }
                // Another id with the same hash (or one of several): compared whole.
                match seen.spill.entry(id.to_string()) {
                    Entry::Occupied(s) => Some(*s.get()),
                    Entry::Vacant(v) => {
                        v.insert(position);
                        None
                    }
                }
            }
        }
    }

    /// The id of the cell at `position` among the cells that survived the rules, rebuilt
    /// (only when two ids share a hash, so rarely).
    fn id_at(&self, position: usize) -> Option<String> {
        let slot = self
            .fates
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.by_rules())
            .nth(position)
            .map(|(i, _)| Slot::Product(i))
            .unwrap_or_else(|| {
                let originals = self.fates.iter().filter(|f| !f.by_rules()).count();
                Slot::Added(position - originals)
            });
        self.try_cell_at(slot).ok().map(|c| c.id.0)
    }

    /// Warns about each rule that matched no cell, with its location.
    fn rule_warnings(&mut self, src: &Source, hits: &[bool]) {
        for (r, hit) in self.rules.iter().zip(hits) {
            if *hit {
                continue;
            }
            let path = format!("rules[{}]", r.index);
            let loc = match src.key_pos(&path) {
                Some(p) => format!("{}:{}:{}: ", src.path.display(), p.line, p.column),
                None => format!("{}: ", src.path.display()),
            };
            self.warnings
                .push(format!("{loc}{} matches no cell", rule_label(r)));
        }
    }

    /// What dropped a cell of this fate, as [`Dropped::by`] and [`Dropped::reason`] say it.
    fn label(&self, fate: Fate) -> (&str, &str) {
        match fate {
            Fate::Rule(r) => (
                &self.rule_labels[r as usize],
                &self.rules[r as usize].rule.reason,
            ),
            Fate::Adapter(k) => {
                let (by, reason) = &self.adapter_labels[k as usize];
                (by, reason)
            }
            Fate::Filter(f) => (&self.filter_labels[f as usize], FILTER_REASON),
            Fate::Run => ("", ""),
        }
    }

    /// The cell in `slot` as it runs (or as the filter saw it).
    fn try_cell_at(&self, slot: Slot) -> Result<Cell, MatrixError> {
        match slot {
            Slot::Product(i) => {
                let (cell, ok) = self.product_cell(&self.choice(i));
                self.extend(cell, ok, None)
            }
            Slot::Added(k) => self.draft_cell(self.added[k].0.clone()),
        }
    }

    /// [`Plan::try_cell_at`] of a cell the walk built without error.
    fn cell_at(&self, slot: Slot) -> Cell {
        checked(self.try_cell_at(slot))
    }

    /// The slots of the cells that run, in order.
    fn run_slots(&self) -> impl Iterator<Item = Slot> + '_ {
        let originals = self
            .fates
            .iter()
            .enumerate()
            .filter(|(_, f)| **f == Fate::Run)
            .map(|(i, _)| Slot::Product(i));
        let added = self
            .added
            .iter()
            .enumerate()
            .filter(|(_, (_, f))| *f == Fate::Run)
            .map(|(k, _)| Slot::Added(k));
        originals.chain(added)
    }

    /// The slots of the dropped cells with their fates, in order: those rules (and
    /// framework adapters) dropped, in product order, then those filters did, in cell order.
    fn drop_slots(&self) -> impl Iterator<Item = (Slot, Fate)> + '_ {
        let by_rules = self
            .fates
            .iter()
            .enumerate()
            .filter(|(_, f)| f.by_rules())
            .map(|(i, f)| (Slot::Product(i), *f));
        let by_filters = self
            .fates
            .iter()
            .enumerate()
            .filter(|(_, f)| matches!(f, Fate::Filter(_)))
            .map(|(i, f)| (Slot::Product(i), *f))
            .chain(
                self.added
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, f))| matches!(f, Fate::Filter(_)))
                    .map(|(k, (_, f))| (Slot::Added(k), *f)),
            );
        by_rules.chain(by_filters)
    }

    /// A dropped cell: as the rules saw it when they dropped it (its parameters when they
    /// resolve, else the defaults), or as the filter saw it.
    fn dropped_cell(&self, slot: Slot, fate: Fate) -> Cell {
        match (slot, fate.by_rules()) {
            (Slot::Product(i), true) => self.product_cell(&self.choice(i)).0,
            _ => self.cell_at(slot),
        }
    }

    /// The cells that run, in order, each built as it is asked for.
    pub(crate) fn cells(&self) -> impl Iterator<Item = Cell> + '_ {
        self.run_slots().map(|s| self.cell_at(s))
    }

    /// The dropped cells in order (rules', then filters'), each built as it is asked for.
    pub(crate) fn dropped(&self) -> impl Iterator<Item = Dropped> + '_ {
        self.drop_slots().map(|(slot, fate)| {
            let (by, reason) = self.label(fate);
            Dropped {
                cell: self.dropped_cell(slot, fate),
                by: by.to_string(),
                reason: reason.to_string(),
            }
        })
    }

    /// What dropped cells, with how many each, in order of first appearance: (by,
    /// reason, count). Counted from the fates, without building a cell.
    pub(crate) fn drop_groups(&self) -> Vec<(&str, &str, usize)> {
        let mut groups: IndexMap<(&str, &str), usize> = IndexMap::new();
        for (_, fate) in self.drop_slots() {
            *groups.entry(self.label(fate)).or_default() += 1;
        }
        groups.into_iter().map(|((b, r), n)| (b, r, n)).collect()
    }

    /// The ids of the dropped cells with this `by` and `reason`, in order, to `f`.
    pub(crate) fn each_dropped_id<E>(
        &self,
        by: &str,
        reason: &str,
        mut f: impl FnMut(&CellId) -> Result<(), E>,
    ) -> Result<(), E> {
        self.each_dropped(|id, _, b, r| {
            if (b, r) == (by, reason) {
                f(id)
            } else {
                Ok(())
            }
        })
    }
}

/// The reason of a cell `--filter` did not select.
pub(crate) const FILTER_REASON: &str = "not selected by the filter";

/// Where a cell of the plan comes from: a combination of the product, or an include entry.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Product(usize),
    Added(usize),
}

/// Errors found during the walk that rank after the errors of later cells' parameters
/// (see the module docs): the first kept, reported once the walk is done.
#[derive(Default)]
struct LateErrors {
    duplicate: Option<MatrixError>,
    run_check: Option<MatrixError>,
}

/// A dropped cell as listings show it: id, values, and what dropped it.
#[derive(Debug, serde::Serialize)]
pub(crate) struct DroppedRef<'c> {
    pub id: &'c CellId,
    pub values: &'c IndexMap<String, Value>,
    pub by: &'c str,
    pub reason: &'c str,
}

/// One cell that combinations are loaded into in turn ([`Plan::load`]): from one
/// combination to the next usually only the last axis changes, so only its value is copied,
/// and the map of values is never rebuilt. A fresh cell per combination was most of the
/// allocations of a walk over a million of them.
struct Scratch {
    cell: Cell,
    /// The value index of each axis in the cell now.
    loaded: Vec<usize>,
    /// Room to decode the next combination into.
    choice: Vec<usize>,
}

/// The cell (or nothing) the walk already built once without error.
fn checked<T>(built: Result<T, MatrixError>) -> T {
    match built {
        Ok(t) => t,
        // The walk returned the first error of any cell that survived the rules, so none
        // of those it kept can fail to build again.
        Err(e) => unreachable!("a cell the expansion checked failed to build: {e}"),
    }
}
