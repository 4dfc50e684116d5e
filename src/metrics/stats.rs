//! Statistics of step times and repeats: median, mean, percentiles, spread.
