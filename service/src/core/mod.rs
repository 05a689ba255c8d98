//! The core of the front door, shared by every area and dialect and knowing
//! none of them: the call context ([`call`]), where a call runs
//! ([`router`]: here on the leader, forwarded from a follower, leader
//! changes waited out), this node in its leader role ([`leader`]), and the
//! parked-call engine ([`park`]). [`Core`] bundles them for the areas.

pub mod call;
pub mod leader;
pub mod park;
pub mod router;

use std::sync::Arc;
use std::time::{Duration, Instant};

use journal::{State, Update, Wait};
use raft::{Applied, RaftNode};
use tonic::Status;

pub use call::{Call, CallError, CallResult};
pub use leader::{now_ms, LocalLeader, Retry};
pub use park::{Parked, Parking};
pub use router::Router;

/// What every area runs its calls through.
pub struct Core {
    router: Router,
    parking: Parking,
    ready_wait: Duration,
}

impl Core {
    /// The core over `router` and `parking`; a call waits up to
    /// `ready_wait` for the service to be configured.
    pub fn new(router: Router, parking: Parking, ready_wait: Duration) -> Self {
        Core {
            router,
            parking,
            ready_wait,
        }
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The parked-call engine.
    pub fn parking(&self) -> &Parking {
        &self.parking
    }

    /// The node.
    pub fn node(&self) -> &Arc<RaftNode> {
        self.router.node()
    }

    /// Reads the state as `call` sees it.
    pub fn read<T>(&self, _call: &Call, f: impl FnOnce(&State) -> T) -> T {
        self.node().state().read(f)
    }

    /// Waits until this node has applied the service configuration (the
    /// first leader proposes it). UNAVAILABLE (no payload: clients retry)
    /// if it does not come in time.
    pub async fn ready(&self, call: &Call) -> Result<(), Status> {
        if self.read(call, |s| s.is_initialized()) {
            return Ok(());
        }
        let deadline = Instant::now() + self.ready_wait;
        let mut rx = self.node().state().subscribe();
        loop {
            rx.borrow_and_update();
            if self.read(call, |s| s.is_initialized()) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return Err(Status::unavailable(
                    "the coordination service is not configured yet (no leader has been elected)",
                ));
            }
        }
    }

    /// Proposes `u` for `call` (see [`Router::propose`]).
    pub async fn propose(&self, call: &Call, u: &mut Update) -> Result<Applied, Status> {
        self.router.propose(call, u).await
    }

    /// Makes the local state safe for a linearizable read (ReadIndex: the
    /// leader confirms its leadership; this node then waits until it has
    /// applied up to the leader's index). Returns the applied index.
    pub async fn linearizable(&self, call: &Call) -> Result<u64, Status> {
        let index = self.router.read_index(call).await?;
        self.parking.wait_applied(index).await?;
        Ok(self.parking.applied_index())
    }

    /// Parks `call` until `wait` answers (see [`Parking::park`]), from log
    /// index `index`, in job `epoch` if the wait belongs to one.
    pub async fn park(
        &self,
        index: u64,
        epoch: Option<u64>,
        wait: Wait,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Parked, Status> {
        self.parking.park(index, epoch, wait, deadline).await
    }
}
