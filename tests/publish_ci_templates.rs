//! The CI templates use only real `bench` arguments, and docs/ci.md (the README's CI
//! section) states what the templates actually do: triggers, inputs and their defaults,
//! permissions, runner labels and tags, artifact names, report paths. A template edit that
//! the docs do not follow fails here. (Their syntax is checked by
//! scripts/check-ci-templates.sh with actionlint, check-jsonschema and hadolint.)

use std::path::Path;

use bench::cli::Cli;
use clap::Parser;
use serde_json::Value;

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// docs/ci.md with every run of whitespace made one space, so rewrapping a paragraph
/// does not matter.
fn docs() -> String {
    squeeze(&read("docs/ci.md"))
}

fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn assert_documented(docs: &str, what: &str) {
    let what = squeeze(what);
    assert!(docs.contains(&what), "docs/ci.md does not mention `{what}`");
}

/// Every `bench ...` command line of a template parses with the real CLI once shell
/// variables are given sample values.
fn assert_parses(line: &str) {
    let line = line
        .replace("\"$MATRIX\"", "matrix/nightly-h100.yaml")
        .replace("\"$BENCH_MATRIX\"", "matrix/nightly-h100.yaml")
        .replace("\"results/$RUN_ID\"", "results/gh-1-1")
        .replace("\"results/$BENCH_RUN_ID\"", "results/gl-1-2")
        .replace("\"$RUN_ID\"", "gh-1-1")
        .replace("\"$BENCH_RUN_ID\"", "gl-1-2")
        .replace(
            "\"${args[@]}\"",
            "matrix/nightly-h100.yaml --run-id gh-1-1 --no-progress",
        )
        .replace(
            "\"${BENCH_HISTORY_URL:-$BENCH_HISTORY_FILE}\"",
            "/builds/bench-history.sqlite",
        )
        .replace("\"$BENCH_TRIAGE_BUDGET\"", "3600")
        .replace("\"$SHARD/$SHARD_TOTAL\"", "1/2")
        .replace("\"${CI_NODE_INDEX:-1}/${CI_NODE_TOTAL:-1}\"", "1/2")
        .replace("\"shards/${CI_NODE_INDEX:-1}\"", "shards/1")
        .replace("shards/*/\"$RUN_ID\"", "shards/1/gl-1 shards/2/gl-1")
        .replace("shards/*/", "shards/a shards/b")
        .replace(
            "${BENCH_FILTER:+--filter \"$BENCH_FILTER\"}",
            "--filter model=gpt2-125m",
        );
    let argv: Vec<&str> = line.split_whitespace().collect();
    assert!(
        !line.contains('$'),
        "unexpanded shell in a template command: {line}"
    );
    Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("template runs `{line}`: {e}"));
}

/// The `bench ...` commands inside a script (one command per line, or after `then`).
fn bench_commands(script: &str) -> Vec<String> {
    script
        .lines()
        .flat_map(|l| l.split(';'))
        .map(|l| l.trim().trim_start_matches("then").trim())
        .filter(|l| l.starts_with("bench "))
        .map(|l| l.split(" || ").next().unwrap_or(l).to_string())
        .collect()
}

#[test]
fn github_workflow_matches_the_docs() {
    let wf = yaml("ci/github/bench.yml");
    let docs = docs();
    let on = &wf["on"];

    assert_eq!(on["schedule"][0]["cron"], "0 2 * * *");
    assert_documented(&docs, "nightly at 02:00 UTC");
    assert_eq!(
        on["pull_request"]["types"],
        serde_json::json!(["labeled", "synchronize", "reopened"])
    );
    let condition = wf["jobs"]["bench"]["if"].as_str().unwrap();
    assert!(condition.contains("'run-bench'"), "{condition}");
    assert!(
        condition.contains("head.repo.full_name == github.repository"),
        "{condition}"
    );
    assert_documented(&docs, "label `run-bench`");
    assert_documented(&docs, "Only branches of the repository itself run");

    // Both entry points take the same inputs with the same defaults, all documented.
    let dispatch = on["workflow_dispatch"]["inputs"].as_object().unwrap();
    let call = on["workflow_call"]["inputs"].as_object().unwrap();
    assert_eq!(
        dispatch.keys().collect::<Vec<_>>(),
        call.keys().collect::<Vec<_>>()
    );
    for (name, spec) in dispatch {
        assert_eq!(spec["default"], call[name]["default"], "input {name}");
        assert_documented(&docs, &format!("`{name}`"));
    }
    assert_documented(
        &docs,
        &format!(
            "(default `{}`)",
            dispatch["matrix"]["default"].as_str().unwrap()
        ),
    );
    let labels = dispatch["runner-labels"]["default"].as_str().unwrap();
    assert_eq!(labels, r#"["self-hosted", "gpu", "h100"]"#);
    assert_documented(&docs, &format!("(default `{labels}`)"));
    // The fallback for schedule and pull_request runs is the same list.
    let runs_on = wf["jobs"]["bench"]["runs-on"].as_str().unwrap();
    assert!(runs_on.contains(&format!("'{labels}'")), "{runs_on}");
    assert_documented(&docs, "--labels gpu,h100");

    let permissions = wf["permissions"].as_object().unwrap();
    assert_eq!(permissions.len(), 4);
    for (scope, level) in permissions {
        assert_documented(&docs, &format!("{scope}: {}", level.as_str().unwrap()));
    }

    let env = &wf["jobs"]["bench"]["env"];
    assert_eq!(
        env["RUN_ID_BASE"],
        "gh-${{ github.run_id }}-${{ github.run_attempt }}"
    );
    // The run id gets the runner's hardware key, so two hardware jobs of one workflow
    // never share one (issue 34).
    let steps_text = serde_json::to_string(&wf["jobs"]["bench"]["steps"]).unwrap();
    assert!(
        steps_text.contains(r#"RUN_ID=$RUN_ID_BASE-${key:-unknown}"#),
        "{steps_text}"
    );
    assert_documented(&docs, "--run-id gh-<run id>-<attempt>-<hardware key>");
    // One job per shard, all under the one run id; none cancels the others.
    let strategy = &wf["jobs"]["bench"]["strategy"];
    assert_eq!(strategy["fail-fast"], false);
    assert_eq!(
        strategy["matrix"]["shard"],
        "${{ fromJSON(inputs.shards || '[1]') }}"
    );
    assert_eq!(env["SHARD_TOTAL"], "${{ strategy.job-total }}");
    assert!(
        steps_text.contains(r#"--shard \"$SHARD/$SHARD_TOTAL\""#),
        "{steps_text}"
    );
    assert_documented(&docs, "`shards` (default `[1]`");
    let shard_steps = wf["jobs"]["bench"]["steps"].as_array().unwrap();
    let shard_upload = shard_steps
        .iter()
        .find(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("actions/upload-artifact@"))
        })
        .expect("each shard uploads its folder");
    assert_eq!(
        shard_upload["with"]["name"],
        "bench-${{ env.RUN_ID }}-shard-${{ matrix.shard }}"
    );
    assert_eq!(shard_upload["with"]["path"], "shards/${{ env.RUN_ID }}/");
    assert_documented(&docs, "`bench-<run-id>-shard-<i>`");
    // The merge job joins them whatever they came to, and publishes the one verdict.
    let merge = &wf["jobs"]["merge"];
    assert_eq!(merge["needs"], "bench");
    assert!(merge["if"].as_str().unwrap().starts_with("always() &&"));
    assert_documented(&docs, "`bench report merge shards/*/ -o results/<run-id>`");
    let steps = merge["steps"].as_array().unwrap();
    let step = |uses: &str| {
        steps
            .iter()
            .find(|s| s["uses"].as_str().is_some_and(|u| u.starts_with(uses)))
            .unwrap_or_else(|| panic!("no step uses {uses}"))
    };
    let upload = step("actions/upload-artifact@");
    assert_eq!(upload["with"]["name"], "bench-${{ env.RUN_ID }}");
    assert_eq!(upload["with"]["path"], "results/${{ env.RUN_ID }}/");
    assert_eq!(upload["with"]["retention-days"], 30);
    assert_eq!(upload["if"], "always()");
    assert_documented(&docs, "the artifact `bench-<run-id>` (kept 30 days");
    assert_documented(
        &docs,
        "--name bench-gh-<run id>-1-<hardware key> --dir results/gh-<run id>-1-<hardware key>",
    );
    let junit = step("mikepenz/action-junit-report@");
    assert_eq!(
        junit["with"]["report_paths"],
        "results/${{ env.RUN_ID }}/junit.xml"
    );
    assert_eq!(junit["with"]["check_name"], "bench (${{ env.MATRIX }})");
    assert_documented(&docs, "\"bench (matrix/nightly-h100.yaml)\"");
    for s in steps {
        if let Some(uses) = s["uses"].as_str() {
            let action = uses.split('@').next().unwrap();
            assert_documented(&docs, &format!("`{action}`"));
        }
    }

    for s in shard_steps {
        if let Some(uses) = s["uses"].as_str() {
            let action = uses.split('@').next().unwrap();
            assert_documented(&docs, &format!("`{action}`"));
        }
    }

    let scripts: Vec<&str> = shard_steps
        .iter()
        .chain(steps)
        .filter_map(|s| s["run"].as_str())
        .collect();
    let commands: Vec<String> = scripts.iter().flat_map(|s| bench_commands(s)).collect();
    assert!(commands.iter().any(|c| c.starts_with("bench matrix")));
    assert!(commands.iter().any(|c| c.starts_with("bench report merge")));
    let post = steps
        .iter()
        .find(|s| {
            s["run"]
                .as_str()
                .is_some_and(|r| r.starts_with("bench report post"))
        })
        .expect("a step posts the comment");
    assert_eq!(post["continue-on-error"], true);
    assert_eq!(post["env"]["GITHUB_TOKEN"], "${{ secrets.GITHUB_TOKEN }}");
    assert_documented(
        &docs,
        "`bench report post results/<run-id> --commit-status`",
    );
    for c in &commands {
        assert_parses(c);
    }
    assert_parses("bench matrix matrix/nightly-h100.yaml --run-id gh-1-1 --no-progress --filter model=gpt2-125m");
}

#[test]
fn gitlab_template_matches_the_docs() {
    let ci = yaml("ci/gitlab/bench.gitlab-ci.yml");
    let docs = docs();
    let job = &ci["bench"];

    assert_eq!(job["stage"], "test");
    assert_eq!(job["tags"], serde_json::json!(["gpu", "h100"]));
    assert_documented(&docs, "(stage `test`, tags `gpu` and `h100`)");
    let rules: Vec<&str> = job["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["if"].as_str().unwrap())
        .collect();
    assert_eq!(rules.len(), 3);
    assert!(rules[0].contains("\"schedule\""));
    assert!(rules[1].contains("\"merge_request_event\"") && rules[1].contains("run-bench"));
    assert!(rules[2].contains("\"web\""));
    assert_documented(
        &docs,
        "merge-request pipelines of merge requests labelled `run-bench`",
    );

    let vars = ci["variables"].as_object().unwrap();
    assert_eq!(vars["BENCH_MATRIX"], "matrix/nightly-h100.yaml");
    assert_eq!(vars["BENCH_RUN_ID"], "gl-${CI_PIPELINE_ID}");
    for name in vars.keys() {
        assert_documented(&docs, &format!("`{name}`"));
    }
    assert_documented(&docs, "`BENCH_MATRIX` (default `matrix/nightly-h100.yaml`)");
    assert_documented(
        &docs,
        "`BENCH_RUN_ID` (default `gl-<pipeline id>`, the hardware key added by the job",
    );

    // The shards fan out with `parallel:` and one job merges them after every stage.
    assert!(job["parallel"].as_u64().is_some_and(|n| n >= 2));
    assert_eq!(job["artifacts"]["paths"], serde_json::json!(["shards/"]));
    assert_documented(&docs, "`parallel: 2`");
    let merge = &ci["bench-merge"];
    assert_eq!(merge["stage"], ".post");
    assert_eq!(merge["tags"], job["tags"]);
    assert_eq!(merge["needs"][0]["job"], "bench");
    for r in merge["rules"].as_array().unwrap() {
        assert_eq!(r["when"], "always");
    }
    assert_documented(&docs, "`bench-merge` (stage `.post`");

    let artifacts = &merge["artifacts"];
    assert_eq!(artifacts["when"], "always");
    assert_eq!(artifacts["expire_in"], "30 days");
    assert_eq!(artifacts["paths"], serde_json::json!(["results/"]));
    assert_eq!(artifacts["reports"]["junit"], "results/*/junit.xml");
    assert_documented(&docs, "`results/*/junit.xml` is the JUnit report");
    assert_documented(&docs, "artifacts for 30 days (`when: always`)");

    let script: Vec<&str> = job["script"]
        .as_array()
        .unwrap()
        .iter()
        .chain(merge["script"].as_array().unwrap())
        .map(|s| s.as_str().unwrap())
        .collect();
    let after: Vec<&str> = merge["after_script"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(after
        .iter()
        .any(|l| l.contains("bench report post \"results/$RUN_ID\"")));
    assert_documented(&docs, "`bench report post \"results/$RUN_ID\"`");
    let commands: Vec<String> = script
        .iter()
        .chain(&after)
        .flat_map(|s| bench_commands(s))
        .collect();
    assert_eq!(commands.len(), 4, "{commands:?}");
    for c in &commands {
        assert_parses(c);
    }
}

#[test]
fn dockerfiles_pin_what_the_docs_say() {
    let docs = docs();
    let cuda = read("docker/Dockerfile.cuda");
    let rocm = read("docker/Dockerfile.rocm");
    for (file, text) in [("cuda", &cuda), ("rocm", &rocm)] {
        assert!(text.contains("ARG TORCH_VERSION=2.11.0"), "{file}");
        assert!(text.contains("ENV LIBTORCH_USE_PYTORCH=1"), "{file}");
        assert!(text.contains("USER 1001"), "{file}");
        assert!(text.contains("install -m 0755 target/release/bench /usr/local/bin/bench"));
    }
    assert!(cuda.contains("ARG CUDA_BASE=nvidia/cuda:13.0."));
    assert!(cuda.contains("nvidia/nccl/lib"));
    assert!(rocm.contains("ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm7.2"));
    assert_documented(&docs, "torch 2.11.0 (CUDA 13.0) with NCCL");
    assert_documented(&docs, "torch 2.11.0 (ROCm 7.2) with RCCL");
    assert_documented(&docs, "`/usr/local/bin/bench`");
    assert_documented(
        &docs,
        "docker build -f docker/Dockerfile.cuda -t bench-cuda:0.1.0 .",
    );
}
