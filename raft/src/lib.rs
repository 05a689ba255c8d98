//! coordstore-raft: replication of the journal across the nodes with openraft
//! 0.9 — the type config, the write batcher (group commit), the read coalescer,
//! the tonic peer transport and membership calls. Filled by the
//! replicated-journal issue.
