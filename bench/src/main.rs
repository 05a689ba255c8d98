//! `coordstore-bench <suite>`: runs a benchmark suite and writes its results
//! to `bench/results/<suite>-<unix time>.json` plus a markdown table on stdout.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use coordstore_bench::{jax_latency, propose};

#[derive(Parser)]
#[command(name = "coordstore-bench")]
struct Cli {
    /// Where results are written.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Subcommand)]
enum Suite {
    /// Replicated write throughput and latency through the Node API.
    Propose {
        /// Cluster sizes.
        #[arg(long, value_delimiter = ',', default_value = "3")]
        nodes: Vec<usize>,
        /// Concurrent proposers.
        #[arg(long, value_delimiter = ',', default_value = "1,64")]
        clients: Vec<usize>,
        /// Seconds per configuration.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Value size.
        #[arg(long, default_value_t = 256)]
        value_bytes: usize,
    },
    /// Stock jaxlib client latency (kv_set, blocking get, 2-task barrier):
    /// jaxlib's built-in service vs coordstore with 1 and 3 nodes.
    JaxLatency {
        /// Iterations per op.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.out)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    match cli.suite {
        Suite::Propose {
            nodes,
            clients,
            seconds,
            value_bytes,
        } => {
            let mut results = Vec::new();
            for &n in &nodes {
                for &c in &clients {
                    eprintln!("propose: {n} nodes, {c} proposers, {seconds} s");
                    results.push(propose::run(n, c, seconds, value_bytes).await?);
                }
            }
            let path = cli.out.join(format!("propose-{stamp}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&results)?)?;
            println!("{}", propose::table(&results));
            eprintln!("results: {}", path.display());
        }
        Suite::JaxLatency { iterations } => {
            let results = jax_latency::run(iterations).await?;
            let path = cli.out.join(format!("jax-latency-{stamp}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&results)?)?;
            println!("{}", jax_latency::table(&results));
            eprintln!("results: {}", path.display());
        }
    }
    Ok(())
}
