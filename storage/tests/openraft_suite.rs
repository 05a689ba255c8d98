//! openraft's own storage test suite against the node's store (log segment
//! files, sled metadata, snapshot file) on a temp dir.

use openraft::testing::log::{StoreBuilder, Suite};
use storage::{Identity, LogStore, StateMachine, StorageError, TypeConfig};
use tempfile::TempDir;

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = TempDir::new().expect("temp dir");
        let identity = Identity {
            cluster_id: "suite".into(),
            node_id: 0,
        };
        let (log, sm) = storage::open(dir.path(), 8 << 20, &identity).expect("open store");
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_openraft_storage_suite() -> Result<(), StorageError> {
    Suite::test_all(SledBuilder).await
}
