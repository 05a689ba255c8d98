//! coordstore-service: a node's front door. The layers, each a folder:
//!
//! * [`wire`] — one module per wire dialect and per API of coordstore's
//!   own: a handler turns a wire request into an area call and the answer
//!   back; dialect-wide rules are applied once.
//! * [`areas`] — one module per area of the state (coordination, the
//!   tf.data dispatcher, the closure queue): the journal commands a call
//!   proposes, what it waits for and reads.
//! * [`core`] — what every call shares: its context, routing to the leader
//!   (forwarding, leader changes waited out), this node as leader, and the
//!   parked-call engine. It knows no area and no dialect.
//! * [`duties`] — the leader runtime: one duty per area, on the leader only
//!   (liveness, deadlines, configuration).
//! * [`ops`] — metrics, health and readiness, logs.
//! * [`cli`] — a node's configuration and the operator CLI.
//!
//! [`node::start`] assembles all of it and serves it on one port, beside
//! the Raft peer service; [`ports`] serves every namespace on its own port.

pub mod areas;
pub mod cli;
pub mod core;
pub mod duties;
pub mod node;
pub mod ops;
pub mod ports;
pub mod wire;
