//! coordstore-agent: the client side of coordstore.
//!
//! * [`Agent`] — the coordination agent of one task, with the API of
//!   TensorFlow's `CoordinationServiceAgent` (`docs/protocols.md`,
//!   CoordinationServiceAgent API): connect, wait for all tasks with device
//!   info, task status, error reporting and an error callback fed by the
//!   service's error propagation, shutdown, reset, the KV store (blocking /
//!   timed / async-cancellable gets, try-get, directories, insert, update,
//!   delete, revisioned watches) and barriers. It knows every node, and
//!   rides through failovers and node restarts: calls are re-issued at the
//!   next node with the same exactly-once origin.
//! * [`preemption::PreemptionSyncManager`] — the preemption sync protocol
//!   (`docs/protocols.md`, Preemption sync) on the agent (same keys and
//!   barrier as JAX).
//! * [`closures`] — the durable closure queue: a `Coordinator` (schedule,
//!   join, done, fetch, attach after a coordinator's death) and a `Worker`
//!   loop, TensorFlow `ClusterCoordinator` semantics (`docs/protocols.md`,
//!   ClusterCoordinator closure queue semantics).
//! * [`rendezvous`] — torchrun's rendezvous decided by the cluster (torch's
//!   `next_rendezvous`: an agent's join is one small write).
//! * [`relay`] — the local proxy that keeps stock clients' connections alive.
//! * [`torch`] — PyTorch's TCPStore protocol: the handshake, a client, and
//!   the relay's side of a torch client's connection.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tonic::Status> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use agent::{Agent, AgentConfig};
//!
//! let nodes = vec!["10.0.0.1:7470".to_string(), "10.0.0.2:7470".into(), "10.0.0.3:7470".into()];
//! let agent = Agent::new(
//!     AgentConfig::new(nodes, "worker", 0),
//!     Arc::new(|e: &tonic::Status| eprintln!("coordination error: {e}")),
//! )?;
//! agent.connect().await?;
//! agent.insert_key_value("config/lr", "0.1").await?;
//! let peer = agent.get_key_value_timeout("ready/worker1", Duration::from_secs(60)).await?;
//! agent.wait_at_barrier("step-100", Duration::from_secs(30), &[]).await?;
//! agent.shutdown().await?;
//! # let _ = peer; Ok(()) }
//! ```

mod agent;
pub mod closures;
pub mod endpoints;
pub mod preemption;
pub mod relay;
pub mod rendezvous;
pub mod torch;

pub use agent::{
    Agent, AgentConfig, AgentState, ChangedKeyValuesCallback, ErrorCallback, KeyValueGet,
    TaskStatusInfo,
};
pub use proto::tf::{CoordinatedTask, CoordinationServiceDeviceInfo};
