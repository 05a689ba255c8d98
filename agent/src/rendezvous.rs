//! torchrun's rendezvous on coordstore's own rendezvous service (the
//! journal's rendezvous area): [`Run::next_rendezvous`] is torch 2.15's
//! `DynamicRendezvousHandler.next_rendezvous` (its exit op, then its join op
//! until the round forms) with every decision made by the cluster. An
//! agent's join is one small write; it then waits at a node for its run's
//! epoch to move (the round formed or moved on, the run closed, room
//! opened), sending keep-alives to the leader while it waits, instead of
//! polling and compare-and-setting the whole state as torch's handler does.
//!
//! ```no_run
//! # async fn demo() -> Result<(), agent::rendezvous::Error> {
//! use std::time::Duration;
//! use agent::closures::Nodes;
//! use agent::rendezvous::{Agent, Run, Settings};
//!
//! let nodes = vec!["10.0.0.1:7470".to_string(), "10.0.0.2:7470".into()];
//! let run = Run::new(&Nodes::plain(&nodes, Some("job42")), "job42")?;
//! let me = Agent { addr: "10.1.0.7".into(), pid: std::process::id().into(), local_id: 0 };
//! let formed = run.next_rendezvous(&me, &Settings::torch(2, 4), Duration::from_secs(600), false).await?;
//! println!("node rank {} of {}", formed.rank, formed.world_size);
//! # Ok(()) }
//! ```

use std::time::Duration;

use proto::coordstore::rendezvous_client::RendezvousClient;
use proto::coordstore::*;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::Status;

use crate::closures::Nodes;
use crate::endpoints::Endpoints;

pub use proto::coordstore::RendezvousPlace as Place;
pub use proto::coordstore::RendezvousView as View;

/// How long calls keep trying other nodes through a failover.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// torch's grace after a join's deadline, in which an agent takes itself
/// out of its round or the wait list before it raises.
const ROLLBACK_GRACE: Duration = Duration::from_secs(5);

/// An agent: torch's node descriptor (address, pid, local id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Agent {
    /// Its address (torch: `local_addr`, or the host's FQDN).
    pub addr: String,
    /// Its process id.
    pub pid: u64,
    /// Its handler's number within the process.
    pub local_id: u64,
}

impl Agent {
    fn wire(&self) -> RendezvousNode {
        RendezvousNode {
            addr: self.addr.clone(),
            pid: self.pid,
            local_id: self.local_id,
        }
    }
}

/// A run's settings (torchrun's `--nnodes MIN:MAX` and rendezvous options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Fewest agents a round forms with.
    pub min_nodes: u32,
    /// Most agents a round takes.
    pub max_nodes: u32,
    /// How long a round with `min_nodes` waits for more.
    pub last_call: Duration,
    /// How often an agent says it is alive.
    pub keep_alive_every: Duration,
    /// How many keep-alives may be missed before the agent is dropped.
    pub keep_alive_max_attempt: u32,
}

impl Settings {
    /// torch's defaults: a 30 s last call, a keep-alive every 5 s, dropped
    /// after 3 missed.
    pub fn torch(min_nodes: u32, max_nodes: u32) -> Settings {
        Settings {
            min_nodes,
            max_nodes,
            last_call: Duration::from_secs(30),
            keep_alive_every: Duration::from_secs(5),
            keep_alive_max_attempt: 3,
        }
    }

    fn wire(&self) -> RendezvousSettings {
        let liveness = self.keep_alive_every * self.keep_alive_max_attempt.max(1);
        RendezvousSettings {
            min_nodes: self.min_nodes,
            max_nodes: self.max_nodes,
            last_call_ms: (self.last_call.as_millis() as u64).max(1),
            liveness_ms: (liveness.as_millis() as u64).max(1),
        }
    }
}

/// Why a rendezvous ended without a round (torch's errors of the same
/// names).
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// The run is closed (torch's `RendezvousClosedError`).
    #[error("the rendezvous is closed")]
    Closed,
    /// The run closed while this agent was redundant: it may exit cleanly
    /// (torch's `RendezvousGracefulExitError`).
    #[error("the rendezvous closed while this agent was redundant")]
    GracefulExit,
    /// The join timed out (torch's `RendezvousTimeoutError`).
    #[error("the rendezvous did not form in time")]
    Timeout,
    /// A call failed.
    #[error(transparent)]
    Status(#[from] Status),
}

/// A round this agent takes part in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Formed {
    /// The run's round.
    pub round: u64,
    /// This agent's rank (its position in torch's order).
    pub rank: u32,
    /// Agents in the round.
    pub world_size: u32,
}

fn client(ch: Channel) -> RendezvousClient<Channel> {
    RendezvousClient::new(ch)
}

/// One rendezvous run (torchrun's `--rdzv-id`) on a cluster.
#[derive(Clone)]
pub struct Run {
    endpoints: Endpoints,
    run: String,
}

impl Run {
    /// Run `run` at `nodes` (namespace, TLS).
    pub fn new(nodes: &Nodes<'_>, run: &str) -> Result<Run, Status> {
        let endpoints = Endpoints::with_tls(nodes.addrs, RETRY_FOR, nodes.tls.clone())
            .and_then(|e| e.in_namespace(nodes.namespace))
            .map_err(Status::invalid_argument)?;
        Ok(Run {
            endpoints,
            run: run.to_string(),
        })
    }

    /// torch's join op, one step: where `agent` stands after it.
    pub async fn join(&self, agent: &Agent, settings: &Settings) -> Result<View, Status> {
        let r = RendezvousJoinRequest {
            run: self.run.clone(),
            node: Some(agent.wire()),
            settings: Some(settings.wire()),
        };
        self.endpoints
            .call(r, |ch, req| async move { client(ch).join(req).await })
            .await
    }

    /// torch's exit op: `agent` leaves its round or list.
    pub async fn leave(&self, agent: &Agent) -> Result<View, Status> {
        let r = RendezvousLeaveRequest {
            run: self.run.clone(),
            node: Some(agent.wire()),
        };
        self.endpoints
            .call(r, |ch, req| async move { client(ch).leave(req).await })
            .await
    }

    /// Closes the run for good.
    pub async fn close(&self) -> Result<View, Status> {
        let r = RendezvousCloseRequest {
            run: self.run.clone(),
        };
        self.endpoints
            .call(r, |ch, req| async move { client(ch).close(req).await })
            .await
    }

    /// What `agent` reads of the run; with `wait`, once its epoch is other
    /// than `epoch` (or `wait` passed).
    pub async fn watch(&self, agent: &Agent, epoch: u64, wait: Duration) -> Result<View, Status> {
        let r = RendezvousWatchRequest {
            run: self.run.clone(),
            node: Some(agent.wire()),
            epoch,
            wait_ms: wait.as_millis() as u64,
        };
        self.endpoints
            .call(r, |ch, mut req| async move {
                // The node's wait, and the way there and back.
                req.set_timeout(wait + Duration::from_secs(10));
                client(ch).watch(req).await
            })
            .await
    }

    /// `agent` is alive (the leader records it; no log entry).
    pub async fn keep_alive(&self, agent: &Agent) -> Result<(), Status> {
        let r = RendezvousKeepAliveRequest {
            run: self.run.clone(),
            node: Some(agent.wire()),
        };
        self.endpoints
            .call(r, |ch, req| async move { client(ch).keep_alive(req).await })
            .await
            .map(|_| ())
    }

    /// torch's `next_rendezvous`: leaves the round `agent` took part in
    /// (`rejoin`: it did), then joins and waits until a round with it
    /// forms, for at most `join_timeout` (a redundant agent waits as long as
    /// it takes), keeping alive every `settings.keep_alive_every`.
    pub async fn next_rendezvous(
        &self,
        agent: &Agent,
        settings: &Settings,
        join_timeout: Duration,
        rejoin: bool,
    ) -> Result<Formed, Error> {
        let deadline = Instant::now() + join_timeout;
        if rejoin {
            self.leave(agent).await?;
        }
        let mut v = self.join(agent, settings).await?;
        let mut alive_at = Instant::now();
        loop {
            if v.closed {
                return Err(match v.place() {
                    Place::Redundant => Error::GracefulExit,
                    _ => Error::Closed,
                });
            }
            if v.complete && v.place() == Place::Participant {
                return Ok(Formed {
                    round: v.round,
                    rank: v.rank,
                    world_size: v.world_size,
                });
            }
            let redundant = v.place() == Place::Redundant;
            let now = Instant::now();
            if !redundant && now >= deadline {
                // torch rolls back within its grace, then raises.
                if now < deadline + ROLLBACK_GRACE {
                    let _ = self.leave(agent).await;
                }
                return Err(Error::Timeout);
            }
            let must_join = match v.place() {
                Place::None => true,
                Place::Waiting => !v.complete,
                Place::Redundant => v.participants < settings.max_nodes,
                Place::Participant => false,
            };
            if must_join {
                v = self.join(agent, settings).await?;
                continue;
            }
            if now >= alive_at + settings.keep_alive_every {
                self.keep_alive(agent).await?;
                alive_at = Instant::now();
            }
            let mut wait = (alive_at + settings.keep_alive_every).saturating_duration_since(now);
            if !redundant {
                wait = wait.min(deadline.saturating_duration_since(now));
            }
            v = self
                .watch(agent, v.epoch, wait.max(Duration::from_millis(1)))
                .await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchs_defaults_drop_an_agent_after_three_missed_keep_alives() {
        let w = Settings::torch(1, 4).wire();
        assert_eq!(
            (w.min_nodes, w.max_nodes, w.last_call_ms, w.liveness_ms),
            (1, 4, 30_000, 15_000)
        );
    }
}
