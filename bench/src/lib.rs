//! coordstore-bench: the benchmark harness. Every suite starts its peers in
//! the same run on the same machine, so results compare as ratios that hold
//! on a noisy machine. Results go to `bench/results/` as JSON plus a
//! markdown table.

pub mod jax_latency;
pub mod propose;
pub mod stats;
