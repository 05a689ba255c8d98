//! coordstore-storage: the node's durable journal. A sled database holds the
//! Raft log (big-endian u64 keys), the vote and log metadata, and snapshots;
//! the state machine is a `journal::State` held in memory and rebuilt at start
//! from the newest snapshot plus the log after it. Filled by the
//! replicated-journal issue.
