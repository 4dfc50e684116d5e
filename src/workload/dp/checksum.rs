//! Parameter checksums a worker prints at the end under `BENCH_PARAM_CHECKSUM=1`, which
//! the multi-GPU tests compare across ranks and against a one-GPU run.

use tch::Kind;

use crate::workload::models::Param;

/// The stderr line `BENCH_PARAM_CHECKSUM=1` makes a worker print at the end.
pub fn checksum_line(rank: u32, sum: f64, sumsq: f64) -> String {
    format!("bench worker: param checksum rank {rank}: {sum:.17e} {sumsq:.17e}")
}

/// The `(sum, sum of squares)` of the first [`checksum_line`] in a worker's stderr.
pub fn parse_checksum_line(stderr: &str) -> Option<(f64, f64)> {
    let line = stderr.lines().find(|l| l.contains("param checksum"))?;
    let mut f = line.rsplit(':').next()?.split_whitespace().map(str::parse);
    Some((f.next()?.ok()?, f.next()?.ok()?))
}

/// Sum and sum of squares of every parameter, in f64: equal on every rank of a correct
/// data-parallel run; `BENCH_PARAM_CHECKSUM=1` prints it at the end for the GPU tests.
pub fn param_checksum(params: &[Param]) -> (f64, f64) {
    tch::no_grad(|| {
        params.iter().fold((0.0, 0.0), |(s, q), p| {
            let d = p.tensor.to_kind(Kind::Double);
            (
                s + d.sum(Kind::Double).double_value(&[]),
                q + d.square().sum(Kind::Double).double_value(&[]),
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_lines_read_back() {
        let text = format!("noise\n{}\n", checksum_line(1, 2.5, -3.25e-7));
        assert_eq!(parse_checksum_line(&text), Some((2.5, -3.25e-7)));
        assert_eq!(
            parse_checksum_line("bench worker: param checksum rank 0: x"),
            None
        );
    }
}
