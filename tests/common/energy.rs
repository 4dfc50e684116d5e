//! The mixed fixture (tests/fixtures/runs/mixed) as a run whose GPU cells read their power,
//! for the reports' tests of the energy metrics: figures follow `metrics::energy`'s formulas
//! from the fixture's own tokens/s; nothing here is measured.

/// The mixed fixture as a run whose GPU cells read their power: each passed cell's GPUs
/// drew 600 W each, so each repeat's tokens/J is its tokens/s / (600 W x its GPUs) and its
/// kWh per 1T tokens follows; and the trend of the first cell's tokens/J over ten earlier
/// nights, the last four 6% lower (an energy change at the same speed).
pub fn energy_run() -> (bench::results::RunResults, bench::trend::Trends) {
    use bench::trend::{TrendPoint, TrendSeries, Trends};
    let mixed = std::fs::read_to_string("tests/fixtures/runs/mixed/results.json").unwrap();
    let mut run: serde_json::Value = serde_json::from_str(&mixed).unwrap();
    run["run_id"] = "energy".into();
    for cell in run["cells"].as_array_mut().unwrap() {
        if cell["status"] != "passed" {
            continue;
        }
        let gpus = cell["values"]["gpus"].as_f64().unwrap();
        let tps: Vec<f64> = cell["metrics"]["tokens_per_s"]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let tpj: Vec<f64> = tps.iter().map(|t| t / (600.0 * gpus)).collect();
        let kwh: Vec<f64> = tpj.iter().map(|t| 1e12 / t / 3.6e6).collect();
        let metric = |xs: &[f64]| {
            let mut s = xs.to_vec();
            s.sort_by(f64::total_cmp);
            serde_json::json!({"value": s[1], "samples": xs, "rel_spread": (s[2] - s[0]) / 2.0 / s[1]})
        };
        cell["metrics"]["tokens_per_joule"] = metric(&tpj);
        cell["metrics"]["kwh_per_1t_tokens"] = metric(&kwh);
        let ids: Vec<u32> = (0..gpus as u32).collect();
        cell["telemetry"] = serde_json::json!({
            "samples": 40, "gpus": ids, "sm_clock_mhz": 1755.0, "max_sm_clock_mhz": 1980.0,
            "power_w": 600.0, "repeat_power_w": [600.0, 600.0, 600.0], "power_limit_w": 700.0,
            "temperature_c": 62.0, "utilization_pct": 100.0, "reasons": {}, "foreign": [],
        });
    }
    let first = &run["cells"][0];
    let now = first["metrics"]["tokens_per_joule"]["value"]
        .as_f64()
        .unwrap();
    let trends = Trends {
        series: vec![TrendSeries {
            cell: first["id"].as_str().unwrap().to_string(),
            metric: "tokens_per_joule".into(),
            points: (0..10u32)
                .map(|k| TrendPoint {
                    time: format!("2026-11-{:02}T02:00:00Z", 12 + k),
                    commit: Some(format!("{:07x}", 0xe0e0000 + k * 4099)),
                    value: now
                        * if k >= 6 { 1.0 } else { 1.0 / 0.94 }
                        * (1.0 + 0.003 * f64::from(k).sin()),
                    change_point: k == 6,
                })
                .collect(),
        }],
    };
    (serde_json::from_value(run).unwrap(), trends)
}
