//! coordstore-service: the front door of a node. Dialect adapters
//! ([`dialect`], [`agent_api`]) translate wire calls into an area's calls
//! ([`coordination`], [`dispatcher`], [`closures`]), which the [`router`] runs on the leader
//! wherever they arrive: the [`leader`] part stamps and proposes through
//! Raft, followers forward, leader changes are waited out. The leader
//! runtime ([`duties`]) runs one duty per area on the leader (liveness,
//! deadlines, configuration). [`server::start`] runs all of it on one port,
//! beside coordstore's own `Node` API and the Raft peer service.

pub mod agent_api;
pub mod closures;
pub mod config;
pub mod coordination;
pub mod ctl;
pub mod dialect;
pub mod dispatcher;
pub mod duties;
pub mod leader;
pub mod logs;
pub mod node_api;
pub mod ops;
pub mod router;
pub mod server;
pub mod tfgraph;
pub mod wake;
