//! coordstore-service: the front door of a node. Dialect adapters translate
//! `xla.coordination` and `tensorflow` coordination calls into core commands;
//! the core validates, stamps and proposes them through Raft (forwarding from
//! followers); the leader runtime owns timers and liveness. Filled by the
//! coordination-service issue.
