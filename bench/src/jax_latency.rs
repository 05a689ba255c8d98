//! `jax-latency`: stock jaxlib's client (2 tasks, `bench/python/jax_latency.py`)
//! against jaxlib's own built-in service (in memory, not replicated: the
//! latency floor) and against coordstore with 1 and 3 nodes, in one run.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use coordstore_tests::{jax, Cluster};
use serde_json::Value;

/// One peer's measurement: the script's JSON object.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PeerLatency {
    /// Peer name.
    pub peer: String,
    /// The script's output (medians, p90s per op).
    pub result: Value,
}

fn script() -> PathBuf {
    crate::workspace().join("bench/python/jax_latency.py")
}

fn measure(target: &[&str], iterations: usize) -> anyhow::Result<Value> {
    let out = Command::new(jax::python())
        .arg(script())
        .args(target)
        .args(["--tasks", "2", "--iterations", &iterations.to_string()])
        .env("TF_CPP_MIN_LOG_LEVEL", "1")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow::anyhow!("no result: {}", String::from_utf8_lossy(&out.stderr)))?;
    let v: Value = serde_json::from_str(line)?;
    anyhow::ensure!(v["ok"] == Value::Bool(true), "bench failed: {line}");
    Ok(v)
}

/// Runs every peer.
pub async fn run(iterations: usize) -> anyhow::Result<Vec<PeerLatency>> {
    let mut results = vec![PeerLatency {
        peer: "jaxlib built-in".into(),
        result: measure(&["--builtin"], iterations)?,
    }];
    for (nodes, name) in [
        (1, "coordstore 1 node"),
        (3, "coordstore 3 nodes (client on leader)"),
    ] {
        let cluster = Cluster::start(nodes, &["--tasks", "2"]);
        let all: Vec<usize> = (0..nodes).collect();
        let leader = cluster.wait_leader(&all, Duration::from_secs(60)).await;
        let addr = cluster.nodes[leader].addr.clone();
        results.push(PeerLatency {
            peer: name.into(),
            result: measure(&["--address", &addr], iterations)?,
        });
        if nodes == 3 {
            let follower = cluster.nodes[(leader + 1) % 3].addr.clone();
            // A fresh job epoch: the previous run used the shutdown barrier.
            let reset = Command::new(coordstore_tests::coordstore_bin())
                .args(["ctl", "--endpoint", &addr, "reset-job"])
                .output()?;
            anyhow::ensure!(reset.status.success(), "reset-job failed");
            results.push(PeerLatency {
                peer: "coordstore 3 nodes (client on follower)".into(),
                result: measure(&["--address", &follower], iterations)?,
            });
        }
    }
    Ok(results)
}

/// A markdown table: median / p90 in ms per op and peer.
pub fn table(results: &[PeerLatency]) -> String {
    let ops = ["kv_set", "kv_blocking_get", "barrier", "kv_handoff"];
    let mut s = String::from("| peer |");
    for op in ops {
        s.push_str(&format!(" {op} p50 / p90 ms |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(ops.len()));
    s.push('\n');
    for r in results {
        s.push_str(&format!("| {} |", r.peer));
        for op in ops {
            let o = &r.result["ops"][op];
            s.push_str(&format!(
                " {:.2} / {:.2} |",
                o["median_ms"].as_f64().unwrap_or(f64::NAN),
                o["p90_ms"].as_f64().unwrap_or(f64::NAN)
            ));
        }
        s.push('\n');
    }
    s
}
