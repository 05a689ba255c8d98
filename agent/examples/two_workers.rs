//! Two worker tasks coordinating through coordstore with the Rust agent:
//! connect, exchange a value, meet at a barrier, shut down.
//!
//! ```sh
//! coordstore serve --job worker=2 &          # one local node
//! cargo run -p coordstore-agent --example two_workers -- 127.0.0.1:7470
//! ```
//! Pass every node (comma-separated) to ride through failovers.

use std::sync::Arc;
use std::time::Duration;

use agent::{Agent, AgentConfig};

#[tokio::main]
async fn main() -> Result<(), tonic::Status> {
    let endpoints: Vec<String> = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7470".into())
        .split(',')
        .map(String::from)
        .collect();
    let mut workers = Vec::new();
    for id in 0..2 {
        let agent = Agent::new(
            AgentConfig::new(endpoints.clone(), "worker", id),
            Arc::new(move |e: &tonic::Status| eprintln!("worker {id}: coordination error: {e}")),
        )?;
        workers.push(tokio::spawn(async move {
            agent.connect().await?;
            agent
                .insert_key_value(&format!("hello/{id}"), format!("from worker {id}"))
                .await?;
            let peer = agent
                .get_key_value_timeout(&format!("hello/{}", 1 - id), Duration::from_secs(30))
                .await?;
            println!("worker {id} got: {}", String::from_utf8_lossy(&peer));
            agent
                .wait_at_barrier("done", Duration::from_secs(30), &[])
                .await?;
            agent.shutdown().await
        }));
    }
    for w in workers {
        w.await.expect("worker task")?;
    }
    Ok(())
}
