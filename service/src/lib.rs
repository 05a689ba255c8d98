//! coordstore-service: the front door of a node. Dialect adapters translate
//! `xla.coordination` and `tensorflow` coordination calls into core commands;
//! the [`core`] validates, stamps and proposes them through Raft, forwarding
//! from followers and waiting out leader changes; the leader runtime owns
//! timers and liveness. [`server::start`] runs all of it on one port, beside
//! coordstore's own `Node` API and the Raft peer service.

pub mod agent_api;
pub mod config;
pub mod coord;
pub mod core;
pub mod ctl;
pub mod dialect;
pub mod node_api;
pub mod push;
pub mod runtime;
pub mod server;
pub mod wake;
