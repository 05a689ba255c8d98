//! coordstore-tests: tests at the edges — real `coordstore` processes on
//! loopback with real sled dirs, SIGKILL fault injection, stock jaxlib and
//! TensorFlow clients. This library is the shared harness: it starts nodes
//! on free 127.0.0.1 ports, kills them (also when the test panics, and via
//! `PR_SET_PDEATHSIG` if the test process itself dies) and talks to them.

pub mod browser;
pub mod jaxsim;
pub mod job;
pub mod lazyfs;
pub mod ns;
pub mod pki;
pub mod proxy;
pub mod wait;
pub mod workload;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::wait::{eventually, holds};
use journal::pb::{coordination::KvInsert, update::Command as Cmd, Origin};
use journal::Update;
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{
    KvGetRequest, KvListRequest, ProposeRequest, StatusRequest, StatusResponse,
};
use tonic::transport::Channel;

/// The workspace root: `COORDSTORE_WORKSPACE`, else where this crate was
/// built from. A copy of the files the benchmark reads (scripts/,
/// tests/python/, bench/python/, target/etcd) can stand in for it on a
/// machine without the source tree (`scripts/bench-pack.sh`).
pub fn workspace() -> PathBuf {
    if let Some(p) = std::env::var_os("COORDSTORE_WORKSPACE") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The `coordstore` binary of this build (`COORDSTORE_BIN`, or next to the
/// running executable or its `deps/` folder). `cargo test --workspace` builds it.
pub fn coordstore_bin() -> PathBuf {
    built_coordstore_bin().unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("test executable path");
        panic!(
            "{} is missing: build it with `cargo build -p coordstore-service` (cargo test --workspace does)",
            exe.with_file_name("coordstore").display()
        )
    })
}

/// [`coordstore_bin`], or None where it is not built.
fn built_coordstore_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COORDSTORE_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let here = exe.parent()?;
    // A binary beside us (target/release/coordstore-bench), or one level up
    // from a test executable in target/debug/deps.
    [
        here.join("coordstore"),
        here.parent().unwrap_or(here).join("coordstore"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// The `coordstore` binary of the last build before namespaces (commit
/// eb5f867, journal feature level 2), for the upgrade tests: built once by
/// `scripts/setup-prev-build.sh` (which `scripts/test.sh` runs) into
/// `target/prev-build/`.
pub fn prev_build_bin() -> PathBuf {
    let bin = workspace().join("target/prev-build/eb5f867/coordstore");
    assert!(
        bin.exists(),
        "{} is missing: run scripts/setup-prev-build.sh (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// The kernel's count of connections dropped because an accept queue was
/// full (`TcpExt: ListenOverflows` of /proc/net/netstat, the whole
/// machine's; each costs its client a 1 s SYN retry).
pub fn listen_overflows() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut rows = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (rows.next()?, rows.next()?);
    let at = names
        .split_whitespace()
        .position(|n| n == "ListenOverflows")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// `n` free loopback addresses (`127.0.0.1:PORT`), e.g. one
/// `--metrics-listen` per node.
pub fn free_addrs(n: usize) -> Vec<String> {
    (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect()
}

/// A free TCP port on loopback address `host` (bound, then released).
pub fn free_port_on(host: &str) -> u16 {
    std::net::TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `n` consecutive ports free on every loopback address of `hosts`
/// (checked by binding each, then released): (first, last).
pub fn free_port_range(hosts: &[&str], n: u16) -> (u16, u16) {
    for _ in 0..200 {
        let low = 20_000 + rand::random::<u16>() % 30_000;
        let high = low + n - 1;
        let all_free = (low..=high).all(|p| {
            hosts
                .iter()
                .all(|h| std::net::TcpListener::bind((*h, p)).is_ok())
        });
        if all_free {
            return (low, high);
        }
    }
    panic!("no {n} consecutive free ports on {hosts:?}");
}

/// Runs `coordstore ARGS` to its end: (succeeded, stdout, stderr).
pub async fn coordstore_cli(args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(coordstore_bin())
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run coordstore");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The loopback address of node index `i` in a cluster whose nodes each
/// have their own (127.0.0.1, 127.0.0.2, ...): namespace ports are the same
/// on every node, so nodes on one machine need an address each.
pub fn node_host(i: usize) -> String {
    format!("127.0.0.{}", i + 1)
}

/// GET `path` from `addr` over HTTP/1.0 (a node's `--metrics-listen`
/// port): (status, body); None if the connection fails.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((status, body))
}

/// The value of the sample `name` (with its label set, as exposed) in a
/// Prometheus text exposition.
pub fn metric_sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// One `coordstore serve` process.
pub struct NodeProc {
    /// Node id (0 for a relay).
    pub id: u64,
    /// HOST:PORT.
    pub addr: String,
    /// Its data dir.
    pub data_dir: PathBuf,
    sub: &'static str,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    /// The binary it runs: this build's, or another ([`NodeProc::set_bin`]).
    bin: Option<PathBuf>,
}

impl NodeProc {
    /// Starts `coordstore relay --listen ADDR --endpoints ...` (log in `dir`).
    pub fn relay(addr: &str, endpoints: &[String], dir: &std::path::Path) -> NodeProc {
        Self::relay_with(addr, endpoints, &[], dir)
    }

    /// [`NodeProc::relay`] with `extra` flags.
    pub fn relay_with(
        addr: &str,
        endpoints: &[String],
        extra: &[String],
        dir: &std::path::Path,
    ) -> NodeProc {
        let mut p = NodeProc {
            id: 0,
            addr: addr.to_string(),
            data_dir: PathBuf::new(),
            sub: "relay",
            args: vec![
                "--listen".into(),
                addr.to_string(),
                "--endpoints".into(),
                endpoints.join(","),
            ]
            .into_iter()
            .chain(extra.iter().cloned())
            .collect(),
            log: dir.join(format!("relay-{}.log", addr.replace(':', "_"))),
            child: None,
            bin: None,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("node log file");
        let mut cmd = Command::new(self.bin.clone().unwrap_or_else(coordstore_bin));
        cmd.arg(self.sub)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        // SAFETY: prctl is async-signal-safe; the child dies with this process.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(cmd.spawn().expect("spawn coordstore"));
    }

    /// SIGKILLs the process (no-op if it is not running).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts `bin serve` as node `id` on `addr` with its data in
    /// `data_dir`, `extra` flags and its log in `log_dir` (a node outside a
    /// [`Cluster`], of another build say).
    pub fn serve_with_bin(
        bin: &std::path::Path,
        id: u64,
        addr: &str,
        data_dir: &std::path::Path,
        extra: &[&str],
        log_dir: &std::path::Path,
    ) -> NodeProc {
        let mut args: Vec<String> = vec![
            "--node-id".into(),
            id.to_string(),
            "--listen".into(),
            addr.into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut p = NodeProc {
            id,
            addr: addr.to_string(),
            data_dir: data_dir.to_path_buf(),
            sub: "serve",
            args,
            log: log_dir.join(format!("node{id}-{}.log", addr.replace(':', "_"))),
            child: None,
            bin: Some(bin.to_path_buf()),
        };
        p.spawn();
        p
    }

    /// Runs `bin` from the next (re)start on (None: this build's binary).
    pub fn set_bin(&mut self, bin: Option<PathBuf>) {
        self.bin = bin;
    }

    /// Stops the process as an operator does (SIGTERM), and waits until it
    /// exits (SIGKILL after `wait`); its exit status.
    pub fn stop(&mut self, wait: Duration) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit(wait);
        self.kill();
        status
    }

    /// Waits until the process exits on its own, up to `wait`: its exit
    /// status, or `None` if it still runs (or never ran).
    pub fn wait_exit(&mut self, wait: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + wait;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the process again (after [`NodeProc::stop`] or a kill).
    pub fn start(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`, `libc::SIGCONT`) to the process.
    pub fn signal(&self, signal: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(c.id() as i32, signal);
            }
        }
    }

    /// Sets `flag` to `value` for the next (re)start: replaces the flag's
    /// value if it is given already, else appends it.
    pub fn set_arg(&mut self, flag: &str, value: &str) {
        match self.args.iter().position(|a| a == flag) {
            Some(p) if p + 1 < self.args.len() => self.args[p + 1] = value.to_string(),
            _ => self.args.extend([flag.to_string(), value.to_string()]),
        }
    }

    /// Drops `flag` and its value from the arguments of the next start.
    pub fn remove_arg(&mut self, flag: &str) {
        if let Some(p) = self.args.iter().position(|a| a == flag) {
            let end = (p + 2).min(self.args.len());
            self.args.drain(p..end);
        }
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// The node's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A cluster of `coordstore` processes on loopback in a temp dir.
pub struct Cluster {
    /// The nodes, index i has id i + 1.
    pub nodes: Vec<NodeProc>,
    /// The temp dir holding data dirs and logs.
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` nodes of another build, the binary `bin`, that form one
    /// cluster; `extra` flags go to every node.
    pub fn start_bin(bin: &std::path::Path, n: usize, extra: &[&str]) -> Cluster {
        let addrs: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        Self::start_with_bin(&addrs, extra, |_| Vec::new(), None, Some(bin))
    }

    /// Starts `n` nodes that form one cluster; `extra` flags go to every node.
    pub fn start(n: usize, extra: &[&str]) -> Cluster {
        let addrs: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        Self::start_at(&addrs, extra, |_| Vec::new())
    }

    /// Starts nodes at `addrs` (ids 1..); `extra` flags go to every node and
    /// `per_node(i)` flag/value pairs to node index `i` (replacing the value
    /// of a flag given already). Raft timing is the tests'
    /// (100 ms heartbeat, 800 ms election timeout) unless `extra` sets
    /// `--raft-heartbeat-ms` / `--election-timeout-ms` itself.
    pub fn start_at(
        addrs: &[String],
        extra: &[&str],
        per_node: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        Self::start_with(addrs, extra, per_node, None)
    }

    /// Starts `n` nodes, node index `i` on loopback address
    /// [`node_host`]`(i)` (so each can serve namespace ports).
    pub fn start_hosts(n: usize, extra: &[&str]) -> Cluster {
        let addrs: Vec<String> = (0..n)
            .map(|i| {
                let host = node_host(i);
                format!("{host}:{}", free_port_on(&host))
            })
            .collect();
        Self::start_at(&addrs, extra, |_| Vec::new())
    }

    /// The hosts of the nodes (their listen addresses without the port).
    pub fn hosts(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| {
                n.addr
                    .rsplit_once(':')
                    .map_or(n.addr.clone(), |(h, _)| h.to_string())
            })
            .collect()
    }

    /// Starts `n` nodes whose data dirs live under `data_root` (logs stay
    /// in the cluster's temp dir).
    pub fn start_on(n: usize, extra: &[&str], data_root: &std::path::Path) -> Cluster {
        let addrs: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        Self::start_with(&addrs, extra, |_| Vec::new(), Some(data_root))
    }

    /// Starts nodes at `addrs` (ids 1..) on the data dirs
    /// `data_root/node{id}` (seeded already, say).
    pub fn start_at_on(addrs: &[String], extra: &[&str], data_root: &std::path::Path) -> Cluster {
        Self::start_with(addrs, extra, |_| Vec::new(), Some(data_root))
    }

    /// [`Cluster::start`] with extra flags for node `i` from `per_node(i)`
    /// (flag, value pairs; a flag given twice keeps the last value).
    pub fn start_each(
        n: usize,
        extra: &[&str],
        per_node: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        let addrs: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        Self::start_with(&addrs, extra, per_node, None)
    }

    fn start_with(
        addrs: &[String],
        extra: &[&str],
        per_node: impl Fn(usize) -> Vec<String>,
        data_root: Option<&std::path::Path>,
    ) -> Cluster {
        Self::start_with_bin(addrs, extra, per_node, data_root, None)
    }

    fn start_with_bin(
        addrs: &[String],
        extra: &[&str],
        per_node: impl Fn(usize) -> Vec<String>,
        data_root: Option<&std::path::Path>,
        bin: Option<&std::path::Path>,
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_root = data_root.unwrap_or(dir.path()).to_path_buf();
        let cluster = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let id = i as u64 + 1;
            let data_dir = data_root.join(format!("node{id}"));
            let mut args: Vec<String> = vec![
                "--node-id".into(),
                id.to_string(),
                "--listen".into(),
                addr.clone(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--cluster".into(),
                cluster.clone(),
            ];
            // Test timing unless the caller sets its own.
            for (flag, value) in [
                ("--raft-heartbeat-ms", "100"),
                ("--election-timeout-ms", "800"),
            ] {
                if !extra.contains(&flag) {
                    args.extend([flag.to_string(), value.to_string()]);
                }
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            let mut node = NodeProc {
                id,
                addr: addr.clone(),
                data_dir,
                sub: "serve",
                args,
                log: dir.path().join(format!("node{id}.log")),
                child: None,
                bin: None,
            };
            for pair in per_node(i).chunks(2) {
                node.set_arg(&pair[0], pair.get(1).map_or("", String::as_str));
            }
            node.set_bin(bin.map(std::path::Path::to_path_buf));
            node.spawn();
            nodes.push(node);
        }
        Cluster { nodes, dir }
    }

    /// Replaces node `i` by a fresh node `id` at `addr` with an empty data
    /// dir, started with `--join` (it waits to be added as a member).
    pub fn replace_with_joiner(&mut self, i: usize, id: u64, addr: &str, extra: &[&str]) {
        self.nodes[i].kill();
        let data_dir = self.dir.path().join(format!("node{id}"));
        let mut args = self.nodes[i].args.clone();
        let set = |args: &mut Vec<String>, flag: &str, value: String| {
            if let Some(p) = args.iter().position(|a| a == flag) {
                args[p + 1] = value;
            }
        };
        set(&mut args, "--node-id", id.to_string());
        set(&mut args, "--listen", addr.to_string());
        set(&mut args, "--data-dir", data_dir.display().to_string());
        if let Some(p) = args.iter().position(|a| a == "--cluster") {
            args[p + 1] = format!("{},{id}={addr}", args[p + 1]);
        }
        args.extend(["--join".to_string(), "true".to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut node = NodeProc {
            id,
            addr: addr.to_string(),
            data_dir,
            sub: "serve",
            args,
            log: self.dir.path().join(format!("node{id}.log")),
            child: None,
            bin: None,
        };
        node.spawn();
        self.nodes[i] = node;
    }

    /// SIGKILLs node `i` (index, not id).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// SIGKILLs every node at once (all signalled before any is waited for).
    pub fn kill_all(&mut self) {
        for n in &self.nodes {
            n.signal(libc::SIGKILL);
        }
        for n in &mut self.nodes {
            n.kill();
        }
    }

    /// Starts node `i` again with its data dir.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].kill();
        self.nodes[i].spawn();
    }

    /// The addresses of every node.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    /// Every node's log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let log = n.log();
                let errors: Vec<&str> = log
                    .lines()
                    .filter(|l| l.contains("ERROR") && !l.contains("timeout while confirming"))
                    .take(20)
                    .collect();
                format!(
                    "--- node {} errors ---\n{}\n--- node {} tail ---\n{}",
                    n.id,
                    errors.join("\n"),
                    n.id,
                    tail(&log, 40)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A client of node `i`, connecting with retries for up to `wait`.
    pub async fn client(&self, i: usize, wait: Duration) -> NodeClient<Channel> {
        connect(&self.nodes[i].addr, wait).await
    }

    /// Waits until every running node `i` in `among` agrees on one leader;
    /// returns the leader's index.
    pub async fn wait_leader(&self, among: &[usize], wait: Duration) -> usize {
        crate::wait::wait(format!("an agreed leader among {among:?}"), wait)
            .context(|| self.logs())
            .until(|| async {
                let mut leaders = BTreeMap::new();
                for &i in among {
                    if let Some(s) = try_status(&self.nodes[i].addr).await {
                        if s.leader_id != 0 {
                            leaders.insert(i, s.leader_id);
                        }
                    }
                }
                let ids: std::collections::BTreeSet<u64> = leaders.values().copied().collect();
                if leaders.len() == among.len() && ids.len() == 1 {
                    let id = *ids.iter().next().expect("one leader");
                    if let Some(i) = self.nodes.iter().position(|n| n.id == id) {
                        return Ok(i);
                    }
                }
                Err(leaders)
            })
            .await
    }

    /// Waits until nodes `among` have applied the same index and hold the
    /// same state digest; returns that digest.
    pub async fn wait_converged(&self, among: &[usize], wait: Duration) -> String {
        crate::wait::wait(format!("nodes {among:?} to converge"), wait)
            .context(|| self.logs())
            .until(|| async {
                let mut seen = Vec::new();
                for &i in among {
                    seen.push(try_status(&self.nodes[i].addr).await);
                }
                let all: Vec<&StatusResponse> = seen.iter().flatten().collect();
                if all.len() == among.len()
                    && all.windows(2).all(|w| {
                        w[0].last_applied == w[1].last_applied
                            && w[0].state_digest == w[1].state_digest
                    })
                {
                    return Ok(all[0].state_digest.clone());
                }
                Err(all
                    .iter()
                    .map(|s| (s.node_id, s.last_applied, s.state_digest.clone()))
                    .collect::<Vec<_>>())
            })
            .await
    }
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Connects to `addr`, retrying until `wait` passes.
pub async fn connect(addr: &str, wait: Duration) -> NodeClient<Channel> {
    NodeClient::new(wire::channel_within(addr, wait).await)
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30)
}

/// The whole journal state of the node at `addr` (read linearizably).
pub async fn journal_state(addr: &str) -> journal::State {
    let mut c = connect(addr, Duration::from_secs(30)).await;
    let snapshot = c
        .state(proto::coordstore::StateRequest::default())
        .await
        .expect("State")
        .into_inner()
        .snapshot;
    journal::State::decode_snapshot(&snapshot).expect("journal state")
}

/// Waits until the journal state at `addr` satisfies `cond`, or panics after
/// `wait`.
pub async fn wait_state(addr: &str, wait: Duration, cond: impl Fn(&journal::State) -> bool) {
    let what = format!("the journal state at {addr} to reach the condition");
    eventually(what, wait, || async {
        holds(cond(&journal_state(addr).await), || "not reached")
    })
    .await;
}

/// How many client calls are parked at the node at `addr` now.
pub async fn parked_calls(addr: &str) -> u64 {
    try_status(addr).await.map_or(0, |s| s.parked_calls)
}

/// Waits until at least `at_least` client calls are parked at the node at
/// `addr` (its status' `parked_calls`), or panics after `wait`.
pub async fn wait_parked(addr: &str, at_least: u64, wait: Duration) {
    eventually(
        format!("{at_least} calls parked at {addr}"),
        wait,
        || async {
            let parked = parked_calls(addr).await;
            holds(parked >= at_least, || format!("{parked} parked"))
        },
    )
    .await;
}

/// The status of the node at `addr`, if it answers within a second.
pub async fn try_status(addr: &str) -> Option<StatusResponse> {
    let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(1));
    let ch = ep.connect().await.ok()?;
    let mut c = NodeClient::new(ch);
    c.status(StatusRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// A writer with its own exactly-once origin (client id, sequence).
pub struct Writer {
    client_id: u64,
    seq: u64,
    namespace: String,
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}

impl Writer {
    /// A writer with a random client id.
    pub fn new() -> Self {
        Writer {
            client_id: rand::random::<u64>() | 1,
            seq: 0,
            namespace: String::new(),
        }
    }

    /// A writer into namespace `name`.
    pub fn in_namespace(name: &str) -> Self {
        Writer {
            namespace: name.into(),
            ..Writer::new()
        }
    }

    /// Inserts `key` = `value` (overwrite allowed) through `client`, retrying
    /// the same origin on transport errors until `wait` passes. Returns the
    /// outcome's error message, if the store refused it.
    pub async fn put(
        &mut self,
        client: &mut NodeClient<Channel>,
        key: &str,
        value: &[u8],
        wait: Duration,
    ) -> Result<(), String> {
        self.seq += 1;
        let u = Update {
            origin: Some(Origin {
                client_id: self.client_id,
                seq: self.seq,
                // One put at a time: every earlier one is done.
                done_below: self.seq,
            }),
            command: Some(Cmd::from(KvInsert {
                key: key.into(),
                value: value.to_vec().into(),
                allow_overwrite: true,
            })),
            namespace: self.namespace.clone(),
            ..Default::default()
        };
        let bytes = u.encode_to_vec();
        let deadline = Instant::now() + wait;
        loop {
            let r = client
                .propose(ProposeRequest {
                    update: bytes.clone().into(),
                })
                .await;
            match r {
                Ok(reply) => {
                    let out = journal::Outcome::decode(reply.into_inner().outcome.as_ref())
                        .map_err(|e| e.to_string())?;
                    return match out.error {
                        Some(e) => Err(e.display()),
                        None => Ok(()),
                    };
                }
                Err(s) if Instant::now() < deadline => {
                    let _ = s;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(s) => return Err(format!("gave up: {s}")),
            }
        }
    }
}

/// The value at `key`, read linearizably through `client`.
pub async fn kv_get(client: &mut NodeClient<Channel>, key: &str) -> Option<Vec<u8>> {
    let r = client
        .kv_get(KvGetRequest { key: key.into() })
        .await
        .expect("kv_get")
        .into_inner();
    r.found.then(|| r.value.to_vec())
}

/// Every key under `prefix` ("" = all), read linearizably.
pub async fn kv_keys(client: &mut NodeClient<Channel>, prefix: &str) -> Vec<String> {
    client
        .kv_list(KvListRequest {
            prefix: prefix.into(),
            limit: 0,
            ..Default::default()
        })
        .await
        .expect("kv_list")
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.key)
        .collect()
}

/// Helpers for the coordination dialects' gRPC clients.
pub mod wire {
    use std::collections::HashMap;
    use std::time::Duration;

    use prost::Message;
    use proto::payloads::GrpcPayloadContainer;
    use tonic::transport::Channel;

    /// An `xla.coordination` client of `addr` (connects with retries).
    pub async fn xla(
        addr: &str,
    ) -> proto::xla::coordination_service_client::CoordinationServiceClient<Channel> {
        proto::xla::coordination_service_client::CoordinationServiceClient::new(channel(addr).await)
            .max_decoding_message_size(1 << 30)
            .max_encoding_message_size(1 << 30)
    }

    /// A `tensorflow` dialect client of `addr`.
    pub async fn tf(
        addr: &str,
    ) -> proto::tf::coordination_service_client::CoordinationServiceClient<Channel> {
        proto::tf::coordination_service_client::CoordinationServiceClient::new(channel(addr).await)
    }

    /// A channel to `addr`, connecting with retries for up to 30 s.
    pub async fn channel(addr: &str) -> Channel {
        channel_within(addr, Duration::from_secs(30)).await
    }

    /// A channel to `addr`, connecting with retries until `wait` passes
    /// (each try 500 ms at most; the test fails after `wait`).
    pub async fn channel_within(addr: &str, wait: Duration) -> Channel {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .connect_timeout(Duration::from_millis(500));
            match ep.connect().await {
                Ok(ch) => return ch,
                Err(e) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "cannot connect to {addr}: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The payload container of an error status (empty map without trailer).
    pub fn payloads(s: &tonic::Status) -> HashMap<String, Vec<u8>> {
        if s.details().is_empty() {
            return HashMap::new();
        }
        GrpcPayloadContainer::decode(s.details())
            .expect("grpc-status-details-bin is a GrpcPayloadContainer")
            .payloads
    }

    /// The decoded xla BarrierError payload, if any.
    pub fn barrier_error(s: &tonic::Status) -> Option<proto::xla::BarrierError> {
        payloads(s)
            .get(proto::payload_keys::BARRIER_ERROR)
            .map(|b| proto::xla::BarrierError::decode(b.as_slice()).expect("BarrierError"))
    }

    /// The decoded xla CoordinationServiceError payload, if any.
    pub fn coordination_error(s: &tonic::Status) -> Option<proto::xla::CoordinationServiceError> {
        payloads(s)
            .get(proto::payload_keys::COORDINATION_SERVICE_ERROR)
            .map(|b| {
                proto::xla::CoordinationServiceError::decode(b.as_slice())
                    .expect("CoordinationServiceError")
            })
    }

    /// The `Incarnations` field of xla requests.
    pub fn inc(task_id: i32, service_incarnation: u64) -> Option<proto::xla::Incarnations> {
        Some(proto::xla::Incarnations {
            task_id,
            task_incarnation: 0,
            service_incarnation,
        })
    }
}

/// Stock jaxlib driven from Python (`tests/python`), for interop tests.
pub mod jax {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::process::CommandExt;
    use std::path::PathBuf;
    use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;
    use std::time::Duration;

    use super::{built_coordstore_bin, workspace};
    use crate::wait::{eventually_blocking, holds, wait};

    /// The Python 3.12 of the jaxlib venv made by `scripts/setup-jax.sh`
    /// (or `COORDSTORE_JAX_PYTHON`).
    pub fn python() -> PathBuf {
        if let Some(p) = std::env::var_os("COORDSTORE_JAX_PYTHON") {
            return PathBuf::from(p);
        }
        let p = workspace().join("target/jax-venv/bin/python");
        assert!(
            p.exists(),
            "{} is missing: run scripts/setup-jax.sh (scripts/test.sh does)",
            p.display()
        );
        p
    }

    /// The Python 3.12 of the TensorFlow venv made by `scripts/setup-tf.sh`
    /// (or `COORDSTORE_TF_PYTHON`).
    pub fn tf_python() -> PathBuf {
        if let Some(p) = std::env::var_os("COORDSTORE_TF_PYTHON") {
            return PathBuf::from(p);
        }
        let p = workspace().join("target/tf-venv/bin/python");
        assert!(
            p.exists(),
            "{} is missing: run scripts/setup-tf.sh (scripts/test.sh does)",
            p.display()
        );
        p
    }

    /// The Python 3.12 of the PyTorch venv made by `scripts/setup-torch.sh`
    /// (or `COORDSTORE_TORCH_PYTHON`): stock torch 2.15.0, CPU and gloo.
    pub fn torch_python() -> PathBuf {
        if let Some(p) = std::env::var_os("COORDSTORE_TORCH_PYTHON") {
            return PathBuf::from(p);
        }
        let p = workspace().join("target/torch-venv/bin/python");
        assert!(
            p.exists(),
            "{} is missing: run scripts/setup-torch.sh (scripts/test.sh does)",
            p.display()
        );
        p
    }

    /// A script of `tests/python`.
    pub fn script(name: &str) -> PathBuf {
        workspace().join("tests/python").join(name)
    }

    /// A Python process whose stdout lines are collected; SIGKILLed on drop
    /// and when the test process dies.
    pub struct PyProc {
        child: Child,
        stdin: Option<ChildStdin>,
        lines: Arc<Mutex<Vec<String>>>,
        /// Reads stdout into `lines` to its end.
        reader: JoinHandle<()>,
        /// What it runs, for messages.
        pub label: String,
        stderr: PathBuf,
    }

    impl PyProc {
        /// Runs `tests/python/<script> <args>` with the venv's Python.
        pub fn spawn(script_name: &str, args: &[String], log_dir: &std::path::Path) -> PyProc {
            let mut p = PyProc::spawn_with(
                &python(),
                script_name,
                args,
                log_dir,
                &[("JAX_PLATFORMS", "cpu")],
            );
            p.label = format!("{script_name} {}", args.join(" "));
            p
        }

        /// Runs `tests/python/<script> <args>` with the Python at `python`
        /// and `env` added to the environment, and `COORDSTORE_BIN` naming
        /// this build's `coordstore` where it is built (for the node's
        /// status, `jax_client.py`).
        pub fn spawn_with(
            python: &std::path::Path,
            script_name: &str,
            args: &[String],
            log_dir: &std::path::Path,
            env: &[(&str, &str)],
        ) -> PyProc {
            let label = format!("{script_name} {}", args.join(" "));
            let stderr = log_dir.join(format!(
                "py-{}-{}.err",
                script_name,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ));
            let mut cmd = Command::new(python);
            cmd.arg(script(script_name))
                .args(args)
                .env("TF_CPP_MIN_LOG_LEVEL", "1")
                .envs(env.iter().copied())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&stderr).expect("stderr file"));
            // SAFETY: prctl is async-signal-safe; the child dies with this process.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            if let Some(bin) = built_coordstore_bin() {
                cmd.env("COORDSTORE_BIN", bin);
            }
            let mut child = cmd.spawn().expect("spawn python");
            let stdout = child.stdout.take().expect("stdout");
            let lines = Arc::new(Mutex::new(Vec::new()));
            let sink = lines.clone();
            let reader = std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    sink.lock().unwrap().push(line);
                }
            });
            PyProc {
                stdin: child.stdin.take(),
                child,
                lines,
                reader,
                label,
                stderr,
            }
        }

        /// The process id.
        pub fn pid(&self) -> u32 {
            self.child.id()
        }

        /// Stdout lines so far.
        pub fn lines(&self) -> Vec<String> {
            self.lines.lock().unwrap().clone()
        }

        /// Waits until a stdout line equals `line`.
        pub fn wait_line(&mut self, line: &str, within: Duration) {
            let (label, lines, stderr) = (&self.label, &self.lines, &self.stderr);
            let child = &mut self.child;
            wait(format!("{label} to print {line}"), within)
                .context(|| report(label, lines, stderr))
                .until_blocking(|| {
                    if lines.lock().unwrap().iter().any(|l| l == line) {
                        return Ok(());
                    }
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!(
                            "{label} exited ({status}) before printing {line}\n{}",
                            report(label, lines, stderr)
                        );
                    }
                    Err("not printed")
                });
        }

        /// Waits until a stdout line starts with `prefix`.
        pub fn wait_line_starting(&mut self, prefix: &str, within: Duration) {
            let (label, lines, stderr) = (&self.label, &self.lines, &self.stderr);
            let child = &mut self.child;
            wait(format!("{label} to print a line starting {prefix}"), within)
                .context(|| report(label, lines, stderr))
                .until_blocking(|| {
                    if lines.lock().unwrap().iter().any(|l| l.starts_with(prefix)) {
                        return Ok(());
                    }
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!(
                            "{label} exited ({status}) before printing {prefix}\n{}",
                            report(label, lines, stderr)
                        );
                    }
                    Err("not printed")
                });
        }

        /// Writes a line to its stdin.
        pub fn send_line(&mut self, line: &str) {
            let stdin = self.stdin.as_mut().expect("stdin open");
            let sent = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
            if let Err(e) = sent {
                panic!(
                    "{} does not take input ({e})\n{}",
                    self.label,
                    self.report()
                );
            }
        }

        /// Waits for the exit within `within` (panic after it; dropping the
        /// process SIGKILLs it), then until its last stdout lines are read.
        pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
            let (label, lines, stderr) = (&self.label, &self.lines, &self.stderr);
            let child = &mut self.child;
            let status = wait(format!("{label} to exit"), within)
                .context(|| report(label, lines, stderr))
                .until_blocking(|| child.try_wait().expect("try_wait").ok_or("still running"));
            let reader = &self.reader;
            eventually_blocking(format!("the end of {label}'s stdout"), READ_TO_END, || {
                holds(reader.is_finished(), || "still reading")
            });
            status
        }

        /// The JSON check lines whose `ok` is false.
        pub fn failed_checks(&self) -> Vec<String> {
            self.lines()
                .into_iter()
                .filter(|l| l.starts_with('{') && l.contains("\"ok\": false"))
                .collect()
        }

        /// Waits for a clean exit with no failed check and the check
        /// `last` passed; `context()` (node logs, say) goes into the failure
        /// message.
        pub fn assert_passes(
            &mut self,
            last: &str,
            wait: Duration,
            context: impl FnOnce() -> String,
        ) {
            let status = self.wait_exit(wait);
            assert!(
                status.success() && self.failed_checks().is_empty(),
                "{status}: {:?}\n{}\n{}",
                self.failed_checks(),
                self.report(),
                context()
            );
            let passed = format!("\"check\": \"{last}\", \"ok\": true");
            assert!(
                self.lines().iter().any(|l| l.contains(&passed)),
                "{}",
                self.report()
            );
        }

        /// Stdout and the tail of stderr, for failure messages.
        pub fn report(&self) -> String {
            report(&self.label, &self.lines, &self.stderr)
        }
    }

    /// How long the reader of an exited process' stdout may take to its end.
    const READ_TO_END: Duration = Duration::from_secs(10);

    /// The stdout `lines` and the tail of the `stderr` file of the process
    /// `label`, for failure messages.
    fn report(label: &str, lines: &Mutex<Vec<String>>, stderr: &std::path::Path) -> String {
        let err = std::fs::read_to_string(stderr).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(30).collect();
        format!(
            "--- {label} stdout ---\n{}\n--- stderr (tail) ---\n{}",
            lines.lock().unwrap().join("\n"),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    impl Drop for PyProc {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
