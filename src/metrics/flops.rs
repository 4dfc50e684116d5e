//! Model FLOPs per token, the peak dense FLOP/s table, MFU and derived throughput figures
//! (formulas and sources in DESIGN.md).
