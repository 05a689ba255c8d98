#![allow(clippy::result_large_err)]
//! The saved vote across a restart: a node's own committed vote comes back
//! uncommitted, so openraft 0.9 does not restore it as leader of its old
//! term with a possibly stale commit index (openraft issue #1511); every
//! other vote comes back exactly as saved, and the stored vote is untouched.

use openraft::storage::RaftLogStorage;
use openraft::Vote;
use storage::Identity;
use tempfile::TempDir;

fn reopen_with(vote: Vote<u64>, node_id: u64) -> Option<Vote<u64>> {
    let dir = TempDir::new().unwrap();
    let identity = Identity {
        cluster_id: "c".into(),
        node_id,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &identity).unwrap();
        log.save_vote(&vote).await.unwrap();
        drop(log);
        drop(_sm);
        let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &identity).unwrap();
        let first = log.read_vote().await.unwrap();
        // Reading does not write the weakened vote back.
        let again = log.read_vote().await.unwrap();
        assert_eq!(first, again);
        first
    })
}

#[test]
fn own_committed_vote_comes_back_uncommitted() {
    assert_eq!(
        reopen_with(Vote::new_committed(7, 2), 2),
        Some(Vote::new(7, 2))
    );
}

#[test]
fn other_votes_come_back_as_saved() {
    // Another node's leadership, committed.
    assert_eq!(
        reopen_with(Vote::new_committed(7, 3), 2),
        Some(Vote::new_committed(7, 3))
    );
    // A vote (for itself or another) not yet committed.
    assert_eq!(reopen_with(Vote::new(8, 2), 2), Some(Vote::new(8, 2)));
    assert_eq!(reopen_with(Vote::new(8, 1), 2), Some(Vote::new(8, 1)));
}
