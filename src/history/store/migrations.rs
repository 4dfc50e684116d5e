//! The history schema: one migration per version, applied in order by
//! [`super::History`] when a store is opened.

/// The schema, one migration per version, applied in order, each in its own transaction
/// together with its row in `bench_schema_migrations`. Never edit a released migration:
/// add the next one.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "runs, cells and metrics",
        "CREATE TABLE bench_runs (
            run_id TEXT PRIMARY KEY,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            commit_sha TEXT,
            git_dirty BIGINT NOT NULL,
            branch TEXT,
            hardware_key TEXT NOT NULL,
            host TEXT NOT NULL,
            matrix_name TEXT NOT NULL,
            bench_version TEXT NOT NULL,
            libtorch TEXT,
            driver TEXT,
            cuda TEXT,
            rocm TEXT,
            nccl TEXT,
            gpu_model TEXT,
            switches TEXT NOT NULL,
            telemetry TEXT,
            throttled BIGINT NOT NULL,
            recorded_at TEXT NOT NULL
        );
        CREATE INDEX bench_runs_key_time ON bench_runs (hardware_key, started_at);
        CREATE TABLE bench_cells (
            run_id TEXT NOT NULL REFERENCES bench_runs (run_id),
            cell_id TEXT NOT NULL,
            status TEXT NOT NULL,
            loss_curve TEXT NOT NULL,
            PRIMARY KEY (run_id, cell_id)
        );
        CREATE TABLE bench_metrics (
            run_id TEXT NOT NULL,
            cell_id TEXT NOT NULL,
            metric TEXT NOT NULL,
            value DOUBLE PRECISION NOT NULL,
            rel_spread DOUBLE PRECISION NOT NULL,
            samples TEXT NOT NULL,
            PRIMARY KEY (run_id, cell_id, metric),
            FOREIGN KEY (run_id, cell_id) REFERENCES bench_cells (run_id, cell_id)
        );
        CREATE INDEX bench_metrics_cell ON bench_metrics (cell_id, metric);",
    ),
    (
        2,
        "segments started by `bench baseline accept`",
        "CREATE TABLE bench_segments (
            cell_id TEXT NOT NULL,
            hardware_key TEXT NOT NULL,
            starts_at TEXT NOT NULL,
            first_run_id TEXT NOT NULL,
            reason TEXT NOT NULL,
            accepted_at TEXT NOT NULL,
            PRIMARY KEY (cell_id, hardware_key, starts_at)
        );",
    ),
    (
        3,
        "per-cell telemetry, context (framework identity) and verdict",
        "ALTER TABLE bench_cells ADD COLUMN telemetry TEXT;
        ALTER TABLE bench_cells ADD COLUMN context TEXT;
        ALTER TABLE bench_cells ADD COLUMN verdict TEXT;
        CREATE INDEX bench_runs_branch ON bench_runs (branch, started_at);",
    ),
    (
        4,
        "per-cell kernel summary of one traced step",
        "CREATE TABLE bench_kernels (
            run_id TEXT NOT NULL,
            cell_id TEXT NOT NULL,
            summary TEXT NOT NULL,
            PRIMARY KEY (run_id, cell_id)
        );",
    ),
    (
        5,
        "per-run triage: the findings' bisections and kernel diffs",
        "CREATE TABLE bench_triage (
            run_id TEXT PRIMARY KEY,
            findings TEXT NOT NULL
        );",
    ),
    (
        6,
        "per-run cost of the verdict: GPU-seconds measuring, confirming and triaging",
        "CREATE TABLE bench_costs (
            run_id TEXT PRIMARY KEY,
            cost TEXT NOT NULL
        );",
    ),
];

/// The newest schema version this bench writes.
pub fn schema_version_known() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}
