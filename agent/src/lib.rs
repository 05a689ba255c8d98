//! coordstore-agent: the client side. [`relay`] is the local proxy that keeps
//! stock clients' connections alive across node failures. The Rust `Agent`
//! (API of the TensorFlow coordination agent, seed 000) and the preemption
//! sync manager arrive with the rest of the agent issue.

pub mod relay;
