//! The saved vote across a restart comes back exactly as saved, a node's own
//! committed vote included. (That a restarted leader does not resume its old
//! term with a stale commit index is the Raft config's business:
//! `enable_leader_restore` is off, and `tests/tests/faults.rs` checks the
//! reads after such a restart.)

use openraft::storage::{RaftLogReader, RaftLogStorage};
use storage::{Identity, Vote};
use tempfile::TempDir;

fn reopen_with(vote: Vote, node_id: u64) -> Option<Vote> {
    let dir = TempDir::new().unwrap();
    let identity = Identity {
        cluster_id: "c".into(),
        node_id,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut log, sm) = storage::open(dir.path(), 8 << 20, &identity).unwrap();
        log.save_vote(&vote).await.unwrap();
        drop(log);
        drop(sm);
        let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &identity).unwrap();
        log.read_vote().await.unwrap()
    })
}

#[test]
fn votes_come_back_as_saved() {
    for (vote, node) in [
        (Vote::new_committed(7, 2), 2),
        (Vote::new_committed(7, 3), 2),
        (Vote::new(8, 2), 2),
        (Vote::new(8, 1), 2),
    ] {
        assert_eq!(reopen_with(vote, node), Some(vote));
    }
}
