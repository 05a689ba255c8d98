//! Operations: what an operator scrapes ([`metrics`]), probes ([`http`]),
//! reads in the logs ([`logs`]), asks when a job is stuck ([`diagnose`];
//! a PyTorch job's store: [`store_waits`]) and looks at ([`ui`], the
//! status page).

pub mod diagnose;
pub mod http;
pub mod logs;
pub mod metrics;
pub mod store_waits;
pub mod ui;

use std::time::Duration;

use crate::core::{Call, Core};

/// How long a readiness check waits for the leader's read index.
pub const READY_WAIT: Duration = Duration::from_secs(1);

/// Whether this node is ready: it knows a leader and has applied the
/// leader's commit index as of now (a ReadIndex round), within
/// [`READY_WAIT`]. `Err` says why not. What `/readyz`, the gRPC health
/// service, `coordstore_ready` and the Node API's Ready answer.
pub async fn ready(core: &Core) -> Result<u64, String> {
    match tokio::time::timeout(READY_WAIT, core.linearizable(&Call::internal())).await {
        Ok(Ok(index)) => Ok(index),
        Ok(Err(e)) => Err(e.into_plain_status().message().to_string()),
        Err(_) => Err(format!(
            "no read index from a leader within {} ms",
            READY_WAIT.as_millis()
        )),
    }
}

/// A node's disk health as `ctl status` and the status page show it.
pub fn disk_json(d: &proto::coordstore::DiskHealth) -> serde_json::Value {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    serde_json::json!({
        "free_bytes": d.free_known.then_some(d.free_bytes),
        "reserve_bytes": d.reserve_bytes,
        "below_reserve": d.low,
        "fsync_p99_ms": d.fsync_p99_us as f64 / 1000.0,
        "slow_fsync_ms": d.slow_fsync_us / 1000,
        "fsync_slow": d.slow,
        "refusing_writes": text(&d.refusing_writes),
        "leader_transfers": d.transfers,
        "last_transfer": text(&d.last_transfer),
        "problem": text(&d.problem),
    })
}

/// Raises this process's soft limit of open files to its hard limit:
/// (before, after). A node holds a socket per client connection, and a
/// stock jaxlib task keeps one open for its whole life.
pub fn raise_open_files() -> std::io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid, initialised rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let before = lim.rlim_cur;
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok((before, lim.rlim_cur))
    }
}
