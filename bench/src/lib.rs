//! coordstore-bench: the benchmark harness. Every suite starts its peers in
//! the same run on the same machine — coordstore with 3 nodes and with 1,
//! etcd 3.4 with 3 members, jaxlib's built-in service — so results compare
//! as ratios that hold on a noisy machine. Results go to `bench/results/` as
//! JSON per run, a markdown table and one PNG chart per workload.

pub mod barrier;
pub mod closures;
pub mod etcd;
pub mod failover;
pub mod handoff;
pub mod jax_latency;
pub mod kv;
pub mod memory;
pub mod namespaces;
pub mod parked;
pub mod peers;
pub mod propose;
pub mod replay;
pub mod report;
pub mod scale;
pub mod stats;
pub mod tfdata;
pub mod torch;
pub mod torch_real;

use std::path::PathBuf;

/// The load generator's tokio worker threads unless `--load-threads` says
/// otherwise (few: servers, clients and the generator share the machine's
/// cores).
pub const DEFAULT_LOAD_THREADS: usize = 2;

static LOAD_THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Sets the load generator's worker threads (once, before its runtime).
pub fn set_load_threads(n: usize) {
    let _ = LOAD_THREADS.set(n.max(1));
}

/// The load generator's worker threads.
pub fn load_threads() -> usize {
    LOAD_THREADS.get().copied().unwrap_or(DEFAULT_LOAD_THREADS)
}

/// The workspace root (`COORDSTORE_WORKSPACE` overrides it).
pub fn workspace() -> PathBuf {
    coordstore_tests::workspace()
}

/// What `scripts/setup-bench.sh` provides.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The etcd 3.4 binary.
    pub etcd: PathBuf,
    /// A TrueType font for chart labels.
    pub font: PathBuf,
}

/// Runs `scripts/setup-bench.sh` once (idempotent: unpacks etcd and a font
/// into `target/` when missing) and returns what it printed.
pub fn tools() -> anyhow::Result<&'static Tools> {
    static TOOLS: std::sync::OnceLock<Result<Tools, String>> = std::sync::OnceLock::new();
    TOOLS
        .get_or_init(|| {
            let script = workspace().join("scripts/setup-bench.sh");
            let out = std::process::Command::new("bash")
                .arg(&script)
                .stderr(std::process::Stdio::inherit())
                .output()
                .map_err(|e| format!("{}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!("{} failed", script.display()));
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            let get = |k: &str| {
                stdout
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(PathBuf::from)
                    .ok_or_else(|| format!("{} printed no {k} line", script.display()))
            };
            Ok(Tools {
                etcd: get("etcd=")?,
                font: get("font=")?,
            })
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))
}
