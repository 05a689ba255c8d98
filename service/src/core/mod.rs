//! The core of the front door, shared by every area and dialect and knowing
//! none of them: the call context ([`call`]), where a call runs
//! ([`router`]: here on the leader, forwarded from a follower, leader
//! changes waited out), this node in its leader role ([`leader`]), the
//! parked-call engine ([`park`]) and what the node alone knows of the store
//! sessions it holds ([`sessions`]). [`Core`] bundles them for the areas.

pub mod call;
pub mod connections;
pub mod leader;
pub mod levels;
pub mod namespaces;
pub mod park;
pub mod router;
pub mod sessions;

use std::sync::Arc;
use std::time::{Duration, Instant};

use journal::{Namespace, State, Update, Wait};
use raft::{Applied, RaftNode};
use tonic::Status;

pub use call::{Access, Admins, Call, CallContext, CallError, CallResult, UpdateKind};
pub use leader::{now_ms, LocalLeader, Retry};
pub use park::{Parked, Parking};
pub use router::Router;

/// What every area runs its calls through.
pub struct Core {
    router: Router,
    parking: Parking,
    ready_wait: Duration,
    admins: Admins,
    /// Peers have a port of their own (see [`Core::with_peer_port`]).
    peer_port: bool,
    sessions: sessions::StoreSessions,
}

impl Core {
    /// The core over `router` and `parking`; a call waits up to
    /// `ready_wait` for the service to be configured.
    pub fn new(router: Router, parking: Parking, ready_wait: Duration) -> Self {
        Core {
            router,
            parking,
            ready_wait,
            admins: Admins::default(),
            peer_port: false,
            sessions: Default::default(),
        }
    }

    /// The same core with the cluster's admin identity.
    pub fn with_admins(mut self, admins: Admins) -> Self {
        self.admins = admins;
        self
    }

    /// The same core on a node whose peers have a port of their own
    /// (`--peer-listen`): node-to-node calls are admitted there only.
    pub fn with_peer_port(mut self, apart: bool) -> Self {
        self.peer_port = apart;
        self
    }

    /// The cluster's admin identity.
    pub fn admins(&self) -> &Admins {
        &self.admins
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The parked-call engine.
    pub fn parking(&self) -> &Parking {
        &self.parking
    }

    /// What this node knows of the store sessions it holds.
    pub fn store_sessions(&self) -> &sessions::StoreSessions {
        &self.sessions
    }

    /// The node.
    pub fn node(&self) -> &Arc<RaftNode> {
        self.router.node()
    }

    /// Reads the whole state of this node.
    pub fn state<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        self.node().state().read(f)
    }

    /// Reads the call's namespace in this node's state; NOT_FOUND naming it
    /// if it does not exist (here, now).
    pub fn read<T>(&self, call: &Call, f: impl FnOnce(Namespace<'_>) -> T) -> CallResult<T> {
        self.state(|s| match s.namespace(call.namespace()) {
            Some(n) => Ok(f(n)),
            None => Err(journal::namespace::unknown(call.namespace_key()).into()),
        })
    }

    /// Waits until this node has applied the call's namespace's
    /// configuration (the first leader proposes the default one; a create
    /// configures another), after admitting the call to the namespace. A
    /// namespace missing here is confirmed missing on an up-to-date state (a
    /// linearizable read) before NOT_FOUND, so a node behind the leader does
    /// not deny a namespace just created. UNAVAILABLE (no payload: clients
    /// retry) if the default namespace is not configured in time.
    async fn configured(&self, call: &Call) -> CallResult<()> {
        // The common case in one look: the namespace exists, admits any
        // client, and is configured.
        let open_and_ready = |s: &State| {
            s.namespace(call.namespace())
                .is_some_and(|n| n.is_initialized() && self.admits(call, &n))
        };
        if self.state(open_and_ready) {
            return Ok(());
        }
        self.admit_to_namespace(call).await?;
        let ready = |s: &State| s.namespace(call.namespace()).map(|n| n.is_initialized());
        let deadline = Instant::now() + self.ready_wait;
        let deadline = call.deadline().map_or(deadline, |d| d.min(deadline));
        let mut rx = self.node().state().subscribe();
        loop {
            rx.borrow_and_update();
            if self.state(ready) == Some(true) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return Err(Status::unavailable(
                    "the coordination service is not configured yet (no leader has been elected)",
                )
                .into());
            }
        }
    }

    /// Admits `call` for `access`: the one admission rule of every service.
    /// A cluster verb admits only the cluster's admins (with client
    /// certificates required; see [`Call::admit_cluster_verb`]). A namespace
    /// call is NOT_FOUND if the namespace does not exist (confirmed on an
    /// up-to-date state: a node behind the leader does not deny a namespace
    /// just created) and PERMISSION_DENIED if it does not admit the client
    /// (see [`Call::admit`]).
    pub async fn admit(&self, call: &Call, access: Access<'_>) -> CallResult<()> {
        match access {
            Access::Open => Ok(()),
            Access::Cluster(verb) => Ok(call.admit_cluster_verb(verb, &self.admins)?),
            Access::Namespace => self.admit_to_namespace(call).await,
            Access::Configured => self.configured(call).await,
            Access::Plaintext { default_leave } => self.admit_plaintext(call, default_leave).await,
            Access::Update(kind) => match kind {
                UpdateKind::Client => self.admit_to_namespace(call).await,
                UpdateKind::ClusterVerb(verb) => Ok(call.admit_cluster_verb(verb, &self.admins)?),
                UpdateKind::LeaderRuntime => Err(Status::permission_denied(
                    "this command is proposed by the leader runtime only",
                )
                .into()),
                UpdateKind::Node => Err(Status::permission_denied(
                    "this command is proposed by the node that holds the connection (NodePeer) only",
                )
                .into()),
            },
            Access::Peer(_) if call.is_admitted() => Ok(()),
            Access::Peer(_) if self.peer_port => Err(Status::permission_denied(
                "a node-to-node call: this node's peers call it on its peer port (--peer-listen)",
            )
            .into()),
            Access::Peer(shared) => Box::pin(self.admit(call, *shared)).await,
            Access::Membership(verb) => {
                call.admit_cluster_verb(verb, &self.admins)?;
                let presented = call.peer_credentials();
                let token = self.node().peer_token();
                Ok(token
                    .check_presented(presented.cluster.as_deref(), presented.token.as_deref())?)
            }
        }
    }

    /// [`Access::Plaintext`]: the namespace exists (confirmed as for
    /// [`Access::Namespace`]) and lets plaintext TCPStore in;
    /// PERMISSION_DENIED saying how to let it in if not.
    async fn admit_plaintext(&self, call: &Call, default_leave: bool) -> CallResult<()> {
        let default = call.namespace() == call::DEFAULT_NAMESPACE;
        let leave = |s: &State| {
            let n = s.namespace(call.namespace())?;
            Some(match default {
                true => default_leave,
                false => n.spec().is_some_and(|p| p.torch_plaintext),
            })
        };
        let leave = match self.state(leave) {
            Some(l) => l,
            None => {
                self.linearizable(call).await?;
                let key = call.namespace_key();
                self.state(leave)
                    .ok_or_else(|| CallError::from(journal::namespace::unknown(key)))?
            }
        };
        if leave {
            return Ok(());
        }
        let how = match default {
            true => "--torch-plaintext on the node".to_string(),
            false => format!("ctl ns create {} --torch-plaintext", call.namespace()),
        };
        Err(Status::permission_denied(format!(
            "a plaintext TCPStore connection on a TLS port of namespace {}: allow it with {how}, or dial a relay",
            call.namespace()
        ))
        .into())
    }

    /// Whether namespace `n` admits `call` (its allow-list, or an admin),
    /// here and now: what a listing shows the caller.
    pub fn admits(&self, call: &Call, n: &Namespace<'_>) -> bool {
        let allow = n.spec().map_or(&[][..], |s| &s.allow_client_names[..]);
        call.admits(allow, &self.admins)
    }

    async fn admit_to_namespace(&self, call: &Call) -> CallResult<()> {
        let allow = |s: &State| {
            let n = s.namespace(call.namespace())?;
            Some(
                n.spec()
                    .map(|p| p.allow_client_names.clone())
                    .unwrap_or_default(),
            )
        };
        let allowed = match self.state(allow) {
            Some(a) => a,
            None => {
                self.linearizable(call).await?;
                // With the coordination payload: a stock jaxlib task fails
                // at once instead of retrying its registration.
                let key = call.namespace_key();
                self.state(allow)
                    .ok_or_else(|| CallError::from(journal::namespace::unknown(key)))?
            }
        };
        Ok(call.admit(&allowed, &self.admins)?)
    }

    /// Proposes `u` for `call` (see [`Router::propose`]).
    pub async fn propose(&self, call: &Call, u: &mut Update) -> CallResult<Applied> {
        self.router.propose(call, u).await
    }

    /// Makes the local state safe for a linearizable read (ReadIndex: the
    /// leader confirms its leadership; this node then waits until it has
    /// applied up to the leader's index). Returns the applied index.
    pub async fn linearizable(&self, call: &Call) -> CallResult<u64> {
        let index = self.router.read_index(call).await?;
        self.unless_stalled(call, self.parking.wait_applied(index))
            .await?;
        Ok(self.parking.applied_index())
    }

    /// Runs `wait` for `call`; a call whose client goes to another node
    /// when told ([`Call::retried_elsewhere`]) ends UNAVAILABLE at once
    /// when this node stalls (its disk or its Raft core stuck: it cannot
    /// serve now), so the client re-issues it at a healthy node. Other
    /// calls wait: an error would end a stock client's job.
    pub async fn unless_stalled<T>(
        &self,
        call: &Call,
        wait: impl std::future::Future<Output = CallResult<T>>,
    ) -> CallResult<T> {
        if !call.retried_elsewhere() {
            return wait.await;
        }
        tokio::select! {
            biased;
            r = wait => r,
            why = self.node().stalls() => Err(stalled(self.node().id(), &why).into()),
        }
    }

    /// Parks `call` until `wait` answers (see [`Parking::park`]), from log
    /// index `index`, in job `epoch` if the wait belongs to one, until
    /// `deadline` (the wait's own: `Ok(None)` then). The caller's deadline
    /// ends it too, with DEADLINE_EXCEEDED: the caller has stopped waiting.
    pub async fn park(
        &self,
        call: &Call,
        index: u64,
        epoch: Option<u64>,
        wait: Wait,
        deadline: Option<tokio::time::Instant>,
    ) -> CallResult<Parked> {
        let ns = call.namespace_key();
        let callers = call.deadline().map(tokio::time::Instant::from_std);
        let first = match (deadline, callers) {
            (Some(d), Some(c)) => Some(d.min(c)),
            (d, c) => d.or(c),
        };
        let parked = self.parking.park(ns, index, epoch, wait, first);
        let parked = self.unless_stalled(call, parked).await?;
        let callers_first = callers.is_some_and(|c| deadline.is_none_or(|d| c < d));
        if parked.is_none() && callers_first {
            return Err(Status::deadline_exceeded(
                "the caller's deadline passed while the call waited",
            )
            .into());
        }
        Ok(parked)
    }
}

/// UNAVAILABLE for a call on node `id`, stalled for `why`.
pub fn stalled(id: u64, why: &str) -> Status {
    Status::unavailable(format!(
        "node {id} cannot serve now ({why}): ask another node"
    ))
}
