//! The cluster's journal feature level at the front door: an update that
//! needs a level the cluster does not run at yet is refused before it is
//! proposed (or forwarded), with FAILED_PRECONDITION naming the command,
//! the level it needs and the members that lack it. The leader raises the
//! level itself once every member applies it (`crate::duties::levels`).
//! See `journal::level` for what each level added.

use super::CallResult;
use std::time::{Duration, Instant};

use raft::RaftNode;
use tonic::Status;

/// How long a call that every member could apply waits for the leader to
/// raise the cluster's level (its duty asks the members every second).
const RAISE_WAIT: Duration = Duration::from_secs(5);

/// Admits what `what` names, which needs journal feature level `need`, if
/// the cluster runs at that level (see the module). While the cluster runs
/// below it, the members are asked: if every one applies it, the call waits
/// (up to [`RAISE_WAIT`]) for the leader to raise the level; otherwise
/// FAILED_PRECONDITION names those that do not. Nothing is proposed.
pub async fn require(node: &RaftNode, need: u32, what: impl FnOnce() -> String) -> CallResult<()> {
    if need <= journal::LEVEL_BASE || need <= cluster_level(node) {
        return Ok(());
    }
    let levels = node.member_levels().await;
    let lacking: Vec<String> = levels
        .iter()
        .filter_map(|(id, level)| match level {
            Ok(l) if *l >= need => None,
            Ok(l) => Some(format!(
                "node {id} (level {l}: {})",
                journal::level::describe(*l)
            )),
            Err(e) => Some(format!("node {id} ({e})")),
        })
        .collect();
    if lacking.is_empty() {
        return wait_raised(node, need).await;
    }
    let have = cluster_level(node);
    Err(Status::failed_precondition(format!(
        "{} needs journal feature level {need} ({}), and the cluster runs at level {have}: {} {} it. \
         Upgrade every member to a build of level {need} or newer; the cluster's level rises by itself \
         once all of them apply it (`coordstore ctl status` shows it)",
        what(),
        journal::level::describe(need),
        lacking.join(", "),
        if lacking.len() == 1 { "lacks" } else { "lack" },
    ))
    .into())
}

/// The level the cluster runs at, as this node has applied it.
pub fn cluster_level(node: &RaftNode) -> u32 {
    node.state().read(|s| s.feature_level())
}

/// Waits until this node has applied a cluster level of at least `need`.
async fn wait_raised(node: &RaftNode, need: u32) -> CallResult<()> {
    let deadline = Instant::now() + RAISE_WAIT;
    let mut rx = node.state().subscribe();
    loop {
        rx.borrow_and_update();
        if cluster_level(node) >= need {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !matches!(tokio::time::timeout(left, rx.changed()).await, Ok(Ok(()))) {
            return Err(Status::unavailable(format!(
                "every member applies journal feature level {need}, and the leader has not raised \
                 the cluster to it yet: retry"
            ))
            .into());
        }
    }
}

/// The journal feature level of node `id` at `address` (not a member yet,
/// say), asked until it answers or `wait` passes: a node just started may
/// not listen yet. The last error if it never answers.
pub async fn level_of(
    node: &RaftNode,
    id: u64,
    address: &str,
    wait: Duration,
) -> Result<u32, String> {
    let deadline = Instant::now() + wait;
    loop {
        match node.level_at(id, address).await {
            Ok(level) => return Ok(level),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
