//! Operations: what an operator scrapes ([`metrics`]), probes ([`http`])
//! and reads in the logs ([`logs`]).

pub mod http;
pub mod logs;
pub mod metrics;

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
