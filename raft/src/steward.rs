//! The steward of a node's health: every [`CHECK_EVERY`] it looks at the
//! disk (`health::Health`), turns the node's elections off while the disk
//! is unhealthy (and a leader can be had elsewhere), and as leader hands
//! leadership to a healthy voter, or refuses client writes while the disk
//! is below its reserve and no voter can take over (see `health` for the
//! rules).

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::type_config::async_runtime::WatchReceiver;
use storage::NodeId;

use crate::health::{Health, CHECK_EVERY};
use crate::network::{ask_health, Channels, PeerToken, Raft};

/// Election timeouts without any leader after which an unhealthy node
/// campaigns again.
pub const LEADERLESS_ELECTIONS: u32 = 3;
/// How long a leader waits for a voter's health.
const ASK_WAIT: Duration = Duration::from_millis(500);

/// What the watch needs of its node.
pub(crate) struct Watched {
    pub(crate) raft: Raft,
    pub(crate) health: Arc<Health>,
    pub(crate) channels: Channels,
    pub(crate) token: PeerToken,
    pub(crate) election_timeout: Duration,
    /// How long elections stay off at start (see `node::election_hold`).
    pub(crate) hold: Duration,
}

/// The watch of one node: looks at its disk every [`CHECK_EVERY`], turns
/// its elections off while it is unhealthy (and a leader can be had
/// elsewhere), and as leader hands leadership to a healthy voter, or
/// refuses client writes while its disk is below the reserve and no voter
/// can take over. Elections stay off until `hold` passed. Ends when Raft
/// stops.
pub(crate) async fn watch(w: Watched) {
    tokio::time::sleep(w.hold).await;
    let healthy = w.health.sample().is_none();
    w.health.set_may_campaign(healthy);
    w.raft.runtime_config().elect(healthy);
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut leaderless_since: Option<Instant> = None;
    let mut last_transfer: Option<Instant> = None;
    let mut said_no_successor: Option<Instant> = None;
    let me = w.raft.metrics().borrow_watched().id;
    let mut core_answered = Instant::now();
    loop {
        tick.tick().await;
        let probe = w.raft.with_raft_state(|_| ());
        match tokio::time::timeout(CHECK_EVERY, probe).await {
            Ok(Ok(())) => core_answered = Instant::now(),
            Ok(Err(_)) => return,
            Err(_) => {}
        }
        w.health.note_stall(core_answered);
        let problem = w.health.sample();
        let m = w.raft.server_metrics().borrow_watched().clone();
        if m.state == openraft::ServerState::Shutdown {
            return;
        }
        let leaderless = m.current_leader.is_none();
        leaderless_since = match (leaderless, leaderless_since) {
            (true, None) => Some(Instant::now()),
            (true, since) => since,
            (false, _) => None,
        };
        let starved = leaderless_since
            .is_some_and(|t| t.elapsed() >= LEADERLESS_ELECTIONS * w.election_timeout);
        set_elections(&w, problem.is_none() || starved, problem.as_deref());
        let leading = m.state == openraft::ServerState::Leader && m.current_leader == Some(m.id);
        let Some(problem) = problem.filter(|_| leading) else {
            w.health.set_refusing(None);
            continue;
        };
        // One transfer per two election timeouts: its election takes one.
        if last_transfer.is_some_and(|t| t.elapsed() < 2 * w.election_timeout) {
            continue;
        }
        match successor(&w, &m, me).await {
            Some(to) => {
                tracing::warn!("node {me} hands leadership to node {to}: {problem}");
                if w.raft.trigger().transfer_leader(to).await.is_err() {
                    return;
                }
                w.health.transferred(to, &problem);
                last_transfer = Some(Instant::now());
            }
            None => {
                let refuse = w.health.report().disk_low.then(|| {
                    format!("node {me} leads and {problem}; no healthy voter can take over")
                });
                if said_no_successor.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    tracing::warn!(
                        refusing_writes = refuse.is_some(),
                        "node {me} should step aside ({problem}) but no voter is healthy"
                    );
                    said_no_successor = Some(Instant::now());
                }
                w.health.set_refusing(refuse);
            }
        }
    }
}

/// Turns this node's elections on or off (see [`watch`]).
fn set_elections(w: &Watched, on: bool, problem: Option<&str>) {
    if !w.health.set_may_campaign(on) {
        return;
    }
    w.raft.runtime_config().elect(on);
    match (on, problem) {
        (false, Some(p)) => {
            tracing::warn!("this node does not campaign while it is unhealthy: {p}")
        }
        (true, Some(p)) => {
            tracing::warn!("no leader for a while: this node campaigns although {p}")
        }
        (true, None) => tracing::info!("this node's disk is healthy again: it may campaign"),
        (false, None) => {}
    }
}

/// The voter to hand leadership to: of the voters that answer healthy
/// (or do not know the question: a build before it), the one that matched
/// the most of the log.
async fn successor(
    w: &Watched,
    m: &openraft::metrics::RaftServerMetrics<storage::TypeConfig>,
    me: NodeId,
) -> Option<NodeId> {
    let membership = m.membership_config.membership();
    let asks = membership
        .voter_ids()
        .filter(|id| *id != me)
        .filter_map(|id| Some((id, membership.get_node(&id)?.addr.clone())))
        .map(|(id, addr)| async move {
            let ch = w.channels.get(id, &addr).ok()?;
            let healthy = ask_health(ch, &w.token, ASK_WAIT).await.ok()?;
            healthy.then_some(id)
        });
    let healthy: Vec<NodeId> = futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect();
    let matched = w.raft.metrics().borrow_watched().replication.clone();
    healthy.into_iter().max_by_key(|id| {
        matched
            .as_ref()
            .and_then(|r| r.get(id).cloned().flatten())
            .map(|l| l.index)
    })
}
