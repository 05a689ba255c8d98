//! The command line: a node's configuration ([`config`]: flags over a TOML
//! file over defaults) and the operator CLI ([`ctl`]).

pub mod config;
pub mod ctl;
pub mod job;
