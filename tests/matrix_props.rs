//! Property tests: parse + expand + filter never panic, whatever the input, and expansion
//! invariants hold on generated valid matrices.

use std::path::Path;

use bench::matrix::{self, filter::Filter, filter::Vocabulary, parse::parse_str};
use proptest::prelude::*;

fn run_all(yaml: &str, filters: &[String]) {
    if let Ok((spec, src)) = parse_str(Path::new("p.yaml"), yaml.to_string()) {
        let _ = matrix::from_spec(spec, &src, filters);
    }
}

/// YAML-ish text built from matrix vocabulary, so that the fuzzer reaches expansion and
/// rule compilation instead of stopping at the first syntax error.
fn yamlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("axes:\n".to_string()),
        Just("  model: [a, b, c]\n".to_string()),
        Just("  gpus: [1, 2, 8]\n".to_string()),
        Just("  parallel: [single, fsdp]\n".to_string()),
        Just("  features: {subsets_of: [compile, sac]}\n".to_string()),
        Just("  features: [[], [sac]]\n".to_string()),
        Just("  x: []\n".to_string()),
        Just("zip: [[gpus, model]]\n".to_string()),
        Just("defaults: {steps: 3, warmup: 1, global_batch: 8}\n".to_string()),
        Just("rules:\n".to_string()),
        Just("  - exclude: {model: a}\n    reason: r\n".to_string()),
        Just("  - when: \"gpus>1 and (\"\n    reason: r\n".to_string()),
        Just("  - when: parallel=single and gpus>1\n    reason: r\n".to_string()),
        Just("  - incompatible: [compile, sac]\n    reason: r\n".to_string()),
        Just("  - requires: {if: has(sac), then: {parallel: fsdp}}\n    reason: r\n".to_string()),
        Just("include:\n  - model: d\n    npm: 6\n  - gpus: 2\n    seq_len: 64\n".to_string()),
        Just("overrides:\n  model:\n    a: {micro_batch: 3}\n".to_string()),
        "[ -~]{0,12}\n".prop_map(|s| s),
        "[\\[\\]{}:,\\- a-z0-9&*!|>'\"#%@`]{0,16}".prop_map(|s| s),
    ];
    prop::collection::vec(token, 0..12).prop_map(|v| v.concat())
}

fn filterish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("model".to_string()),
        Just("gpus".to_string()),
        Just("=".to_string()),
        Just("!=".to_string()),
        Just(">=".to_string()),
        Just("~".to_string()),
        Just("a".to_string()),
        Just("8".to_string()),
        Just("/^a/".to_string()),
        Just("/(/".to_string()),
        Just(" and ".to_string()),
        Just(" or ".to_string()),
        Just("not ".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just("has(".to_string()),
        Just("sac".to_string()),
        Just("\"".to_string()),
        "[ -~]{0,4}".prop_map(|s| s),
        "\\PC{0,3}".prop_map(|s| s),
    ];
    prop::collection::vec(token, 0..10).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(yaml in "\\PC{0,200}", f in "\\PC{0,40}") {
        run_all(&yaml, &[f]);
    }

    #[test]
    fn matrix_shaped_text_never_panics(yaml in yamlish(), f in filterish()) {
        run_all(&yaml, &[f]);
    }

    #[test]
    fn filters_never_panic(f in filterish()) {
        let _ = Filter::parse(&f, &Vocabulary::default());
    }

    /// On valid matrices every combination is either a cell or dropped, ids are unique,
    /// and expanding twice gives the same order.
    #[test]
    fn expansion_invariants(
        n_models in 1usize..5,
        gpus in prop::collection::btree_set(1i64..9, 1..4),
        flags in prop::collection::btree_set("[a-d]", 0..3),
    ) {
        let models: Vec<String> = (0..n_models).map(|i| format!("m{i}")).collect();
        let gpus: Vec<String> = gpus.iter().map(|g| g.to_string()).collect();
        let flags: Vec<String> = flags.into_iter().collect();
        let yaml = format!(
            "axes:\n  model: [{}]\n  gpus: [{}]\n  features: {{subsets_of: [{}]}}\nrules:\n  - when: gpus>4\n    reason: big\n",
            models.join(", "), gpus.join(", "), flags.join(", ")
        );
        let (spec, src) = parse_str(Path::new("p.yaml"), yaml.clone()).unwrap();
        let a = matrix::from_spec(spec.clone(), &src, &[]).unwrap();
        let b = matrix::from_spec(spec, &src, &[]).unwrap();
        let total = n_models * gpus.len() * (1usize << flags.len());
        prop_assert_eq!(a.combinations, total);
        prop_assert_eq!(a.cells.len() + a.dropped.len(), total);
        let ids: std::collections::HashSet<_> = a.cells.iter().map(|c| c.id.clone()).collect();
        prop_assert_eq!(ids.len(), a.cells.len());
        prop_assert!(a.cells.iter().all(|c| c.gpus() <= 4));
        prop_assert_eq!(
            a.cells.iter().map(|c| &c.id).collect::<Vec<_>>(),
            b.cells.iter().map(|c| &c.id).collect::<Vec<_>>()
        );
    }
}
