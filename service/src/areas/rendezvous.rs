//! The rendezvous area's calls (journal area `rendezvous`): an agent's
//! join, leave and the run's close each propose one update through the
//! core (a follower forwards it to the leader) with the caller's origin, so
//! a retried call is exactly-once; an agent waits for its run's epoch to
//! move parked on this node's applied state, so it rides through leader
//! changes; a keep-alive is recorded by the leader's rendezvous duty and
//! never becomes an entry.

use std::sync::Arc;
use std::time::Duration;

use journal::pb::outcome;
use journal::pb::rendezvous::{self as cmd, command::Command, Node, View};
use journal::Wait;
use tokio::time::Instant;

use crate::core::Call;
use crate::core::{CallError, CallResult, Core};
use crate::duties::rendezvous::RendezvousDuty;

/// Longest one watch waits.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// The rendezvous area of one node.
#[derive(Clone)]
pub struct Rendezvous {
    core: Arc<Core>,
    duty: Arc<RendezvousDuty>,
}

impl Rendezvous {
    /// Calls through `core`; keep-alives to `duty` when this node leads.
    pub fn new(core: Arc<Core>, duty: Arc<RendezvousDuty>) -> Self {
        Rendezvous { core, duty }
    }

    /// The core.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Proposes `command` for call `c`: the agent's view after it. A domain
    /// error is the call's status.
    pub async fn step(&self, c: &Call, command: impl Into<Command>) -> CallResult<View> {
        let mut u = c.update(command.into());
        let applied = self.core.propose(c, &mut u).await?;
        if let Some(e) = applied.outcome.error {
            return Err(CallError::Domain(e));
        }
        let view = match applied.outcome.reply {
            Some(outcome::Reply::Rendezvous(r)) => r.view,
            _ => None,
        };
        Ok(view.unwrap_or_default())
    }

    /// What `node` reads of run `run` once the state is up to date; with
    /// `wait`, once the run's epoch is other than `epoch` or `wait` passed.
    pub async fn watch(
        &self,
        c: &Call,
        run: &str,
        node: &Node,
        epoch: u64,
        wait: Option<Duration>,
    ) -> CallResult<View> {
        let index = self.core.linearizable(c).await?;
        if let Some(w) = wait.filter(|w| !w.is_zero()) {
            let wait = Wait::Rendezvous {
                run: run.to_string(),
                epoch,
            };
            let deadline = Instant::now() + w.min(MAX_WAIT);
            if let Some(Err(e)) = self.core.park(c, index, None, wait, Some(deadline)).await? {
                return Err(CallError::Domain(e));
            }
        }
        self.core.read(c, |n| n.rendezvous().view(run, node))
    }

    /// Records on this node, the leader, that `node` of run `run` is alive.
    pub fn keep_alive_here(&self, c: &Call, run: &str, node: &Node) {
        self.duty.keep_alive(c.namespace_key(), run, node);
    }
}

/// A join of `node` into run `run`.
pub fn join(run: String, node: Node, settings: cmd::Settings) -> cmd::Join {
    cmd::Join {
        run,
        node: Some(node),
        settings: Some(settings),
    }
}
