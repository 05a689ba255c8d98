//! Latency statistics.

use std::time::Duration;

/// Latency summary in milliseconds.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Latency {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
}

/// Summarises `samples` (sorted in place).
pub fn summarize(samples: &mut [Duration]) -> Latency {
    samples.sort_unstable();
    let q = |p: f64| -> f64 {
        if samples.is_empty() {
            return f64::NAN;
        }
        let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples[i].as_secs_f64() * 1000.0
    };
    Latency {
        n: samples.len(),
        p50_ms: q(0.50),
        p90_ms: q(0.90),
        p99_ms: q(0.99),
    }
}
