//! Operations: what an operator scrapes ([`metrics`]), probes ([`http`])
//! and reads in the logs ([`logs`]).

pub mod http;
pub mod logs;
pub mod metrics;
