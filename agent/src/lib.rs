//! coordstore-agent: the client side. A Rust `Agent` with the API of the
//! TensorFlow coordination agent (seed 000) that knows every node and rides
//! through failovers, the preemption sync manager built on it, and the relay
//! that keeps stock clients' connections alive. Filled by the agent issue.
