//! `scale`: one job of N simulated jaxlib tasks (`coordstore_tests::jaxsim`:
//! the calls a stock jaxlib 0.12 client makes, in one process), or a fleet
//! of M jobs of N/M tasks in M namespaces, through its life in phases —
//! register, topology exchange, barrier, steady heartbeats, shutdown —
//! each timed by its slowest task. Peers: coordstore with 1 and 3 nodes
//! (tasks spread over every node; followers forward) and jaxlib's built-in
//! service in its own process, driven by the same generator. Per phase:
//! each server's CPU seconds and RSS, p99 per call kind, errors; in the
//! steady phase the leader's CPU and Raft log entries per second.

use std::collections::BTreeMap;
use std::time::Duration;

use coordstore_tests::jaxsim::{CallStats, JobSpec, PhaseReport, Sim, SimConfig};
use coordstore_tests::{free_port_range, node_host, ns, try_status, Cluster};

use crate::memory::rss;
use crate::peers::{Peer, PeerKind};

/// What to run.
#[derive(Clone, Debug)]
pub struct Load {
    /// Task counts (N).
    pub tasks: Vec<usize>,
    /// Jobs (namespaces) the N tasks are split into (1: one job in the
    /// default namespace).
    pub namespaces: usize,
    /// Tasks per HTTP/2 connection; `None`: 1, or as many as the file
    /// descriptor limit needs.
    pub tasks_per_conn: Option<usize>,
    /// Length of the steady phase.
    pub steady: Duration,
    /// The jobs' heartbeat timeout (jaxlib heartbeats every half of it).
    pub heartbeat_timeout: Duration,
    /// How long one call may take before it counts as an error.
    pub call_timeout: Duration,
}

/// One server process over one phase.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ServerUse {
    /// `leader`, `follower` or `built-in`.
    pub role: String,
    /// CPU seconds (user + system) spent in the phase.
    pub cpu_s: f64,
    /// RSS at the phase's end, MiB.
    pub rss_mib: f64,
}

/// One phase of one run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PhaseRow {
    /// The phase.
    pub phase: String,
    /// Its slowest task, s.
    pub seconds: f64,
    /// Each server.
    pub servers: Vec<ServerUse>,
    /// Calls by kind.
    pub calls: BTreeMap<String, CallStats>,
    /// Failed calls.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Raft log entries appended during the phase (coordstore).
    pub log_entries: Option<u64>,
}

/// One (peer, N) run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ScaleRow {
    /// Peer name.
    pub peer: String,
    /// Tasks in all.
    pub tasks: usize,
    /// Jobs (namespaces).
    pub namespaces: usize,
    /// Tasks per connection used.
    pub tasks_per_conn: usize,
    /// `ok`, or how the run failed.
    pub outcome: String,
    /// Each server's RSS before any task registered, MiB.
    pub empty_rss_mib: Vec<f64>,
    /// The phases run.
    pub phases: Vec<PhaseRow>,
}

impl ScaleRow {
    /// register + exchange + barrier + shutdown, s (None unless all ran).
    pub fn job_seconds(&self) -> Option<f64> {
        let want = ["register", "exchange", "barrier", "shutdown"];
        let got: Vec<f64> = want
            .iter()
            .filter_map(|p| {
                self.phases
                    .iter()
                    .find(|x| x.phase == *p)
                    .map(|x| x.seconds)
            })
            .collect();
        (got.len() == want.len()).then(|| got.iter().sum())
    }

    /// Bytes of RSS per task on each server beyond the empty one's, after
    /// the barrier (every task registered, its keys set).
    pub fn rss_per_task(&self) -> Vec<f64> {
        let Some(p) = self.phases.iter().find(|p| p.phase == "barrier") else {
            return Vec::new();
        };
        p.servers
            .iter()
            .zip(&self.empty_rss_mib)
            .map(|(s, e)| (s.rss_mib - e) * 1024.0 * 1024.0 / self.tasks as f64)
            .collect()
    }

    /// The steady phase's (leader CPU %, log entries per second).
    pub fn steady(&self) -> Option<(f64, f64)> {
        let p = self.phases.iter().find(|p| p.phase == "steady")?;
        let leader = p
            .servers
            .iter()
            .find(|s| s.role != "follower")
            .map_or(0.0, |s| s.cpu_s);
        let entries = p.log_entries.unwrap_or(0) as f64;
        Some((100.0 * leader / p.seconds, entries / p.seconds))
    }
}

/// The servers of one run.
enum Servers {
    Coordstore(Cluster),
    Builtin(Peer),
}

impl Servers {
    fn pids(&self) -> Vec<Option<u32>> {
        match self {
            Servers::Coordstore(c) => c.nodes.iter().map(|n| n.pid()).collect(),
            Servers::Builtin(p) => vec![p.pid(0)],
        }
    }

    /// Each server's role, now.
    async fn roles(&self) -> Vec<String> {
        match self {
            Servers::Coordstore(c) => {
                let mut roles = Vec::new();
                for n in &c.nodes {
                    let s = try_status(&n.addr).await;
                    let leads = s.is_some_and(|s| s.leader_id == n.id);
                    roles.push(if leads { "leader" } else { "follower" }.to_string());
                }
                roles
            }
            Servers::Builtin(_) => vec!["built-in".into()],
        }
    }

    /// The leader's last log index (coordstore).
    async fn log_index(&self) -> Option<u64> {
        let Servers::Coordstore(c) = self else {
            return None;
        };
        let mut best = None;
        for n in &c.nodes {
            if let Some(s) = try_status(&n.addr).await {
                best = best.max(Some(s.last_log_index));
            }
        }
        best
    }
}

/// CPU seconds (user + system) of process `pid` so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces) end with ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// Raises this process's open-file limit to its hard limit; returns it.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}

/// Runs every N on every peer of `peers` (coordstore 1 and 3 nodes, the
/// built-in service).
pub async fn run(peers: &[PeerKind], load: &Load) -> anyhow::Result<Vec<ScaleRow>> {
    let nofile = raise_nofile();
    let mut rows = Vec::new();
    for &n in &load.tasks {
        for &kind in peers.iter().filter(|k| k.is_xla()) {
            if kind == PeerKind::Builtin && load.namespaces > 1 {
                continue;
            }
            // One connection per task unless the descriptors would run out
            // (this process holds every client end).
            let per = load
                .tasks_per_conn
                .unwrap_or_else(|| n.div_ceil((nofile as usize).saturating_sub(2048).max(1)));
            eprintln!(
                "scale: {}, {n} tasks in {} job(s), {per} task(s) per connection",
                kind.name(),
                load.namespaces
            );
            let row = match one(kind, n, per, load).await {
                Ok(row) => row,
                Err(e) => ScaleRow {
                    peer: kind.name().into(),
                    tasks: n,
                    namespaces: load.namespaces,
                    tasks_per_conn: per,
                    outcome: format!("failed to start: {e:#}"),
                    empty_rss_mib: Vec::new(),
                    phases: Vec::new(),
                },
            };
            eprintln!("scale: {} {n}: {}", kind.name(), row.outcome);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// One peer, one N.
async fn one(kind: PeerKind, n: usize, per: usize, load: &Load) -> anyhow::Result<ScaleRow> {
    let m = load.namespaces.max(1);
    let mut ui = None;
    let (servers, jobs) = match kind {
        PeerKind::Builtin => {
            let peer = Peer::launch(PeerKind::Builtin, n as u32, load.heartbeat_timeout).await?;
            let jobs = vec![JobSpec {
                tasks: n,
                addrs: vec![peer.addr(0)],
            }];
            (Servers::Builtin(peer), jobs)
        }
        _ => {
            let (cluster, jobs, metrics) = start_coordstore(kind, n, load).await?;
            // The status page refreshing (--ui-refresh-ms) while the job runs.
            ui = crate::peers::UiRefresher::maybe(&metrics);
            (Servers::Coordstore(cluster), jobs)
        }
    };
    let pids = servers.pids();
    let empty_rss_mib = pids
        .iter()
        .map(|p| p.and_then(|p| rss(p).ok()).unwrap_or(0) as f64 / (1024.0 * 1024.0))
        .collect();
    let mut row = ScaleRow {
        peer: kind.name().into(),
        tasks: n,
        namespaces: m,
        tasks_per_conn: per,
        outcome: "ok".into(),
        empty_rss_mib,
        phases: Vec::new(),
    };
    let cfg = SimConfig {
        jobs,
        tasks_per_conn: per,
        heartbeat_interval: load.heartbeat_timeout / 2,
        call_timeout: load.call_timeout,
    };
    let mut sim = match Sim::connect(cfg).await {
        Ok(s) => s,
        Err(e) => {
            row.outcome = format!("connect: {e:#}");
            return Ok(row);
        }
    };
    run_phases(&mut sim, &servers, &pids, load, &mut row).await;
    if row.outcome == "ok" {
        if let Some(e) = row.phases.iter().find_map(|p| p.first_error.clone()) {
            row.outcome = format!("errors: {e}");
        }
    }
    drop(sim);
    drop(ui);
    drop(servers);
    Ok(row)
}

/// A coordstore cluster of `kind` for `n` tasks: one job in the default
/// namespace, or `load.namespaces` jobs of n/M tasks, a namespace each,
/// served on every node; the cluster, the jobs and each node's metrics
/// listener.
async fn start_coordstore(
    kind: PeerKind,
    n: usize,
    load: &Load,
) -> anyhow::Result<(Cluster, Vec<JobSpec>, Vec<String>)> {
    let m = load.namespaces.max(1);
    let hb_ms = load.heartbeat_timeout.as_millis().to_string();
    let nodes = if kind == PeerKind::Coordstore3 { 3 } else { 1 };
    let hosts: Vec<String> = (0..nodes).map(node_host).collect();
    let refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let (low, high) = free_port_range(&refs, (m + 1) as u16);
    let range = format!("{low}-{high}");
    let tasks = if m == 1 { n } else { 1 };
    let tasks = tasks.to_string();
    let mut flags = vec![
        "--tasks",
        &tasks,
        "--heartbeat-timeout-ms",
        &hb_ms,
        "--raft-heartbeat-ms",
        "100",
        "--election-timeout-ms",
        "1000",
        "--namespace-ports",
        &range,
    ];
    let extra = crate::peers::SERVER_FLAGS
        .get()
        .cloned()
        .unwrap_or_default();
    flags.extend(extra.iter().map(String::as_str));
    // Each node's metrics listener (the status page's), on its own host.
    let metrics: Vec<String> = hosts
        .iter()
        .map(|h| format!("{h}:{}", coordstore_tests::free_port_on(h)))
        .collect();
    let addrs: Vec<String> = hosts
        .iter()
        .map(|h| format!("{h}:{}", coordstore_tests::free_port_on(h)))
        .collect();
    let cluster = Cluster::start_at(&addrs, &flags, |i| {
        vec!["--metrics-listen".into(), metrics[i].clone()]
    });
    let all: Vec<usize> = (0..nodes).collect();
    let leader = cluster.wait_leader(&all, Duration::from_secs(60)).await;
    let jobs = if m == 1 {
        vec![JobSpec {
            tasks: n,
            addrs: cluster.addrs(),
        }]
    } else {
        let mut jobs = Vec::new();
        for j in 0..m {
            let settings = proto::coordstore::NamespaceSettings {
                heartbeat_timeout_ms: Some(load.heartbeat_timeout.as_millis() as u64),
                ..ns::tasks((n / m) as u32)
            };
            let info = ns::create(&cluster.nodes[leader].addr, &format!("job-{j}"), settings)
                .await
                .map_err(|e| anyhow::anyhow!("create job-{j}: {e}"))?;
            jobs.push(JobSpec {
                tasks: n / m,
                addrs: (0..nodes).map(|i| ns::addr(&cluster, i, &info)).collect(),
            });
        }
        for j in 0..m {
            ns::wait_serving(&cluster, &format!("job-{j}"), Duration::from_secs(120)).await;
        }
        jobs
    };
    Ok((cluster, jobs, metrics))
}

/// Runs the job's phases on `sim`, each into `row` with the servers' CPU
/// seconds, RSS and log growth; ends after a phase with errors (but the
/// steady one), naming them in the outcome.
async fn run_phases(
    sim: &mut Sim,
    servers: &Servers,
    pids: &[Option<u32>],
    load: &Load,
    row: &mut ScaleRow,
) {
    for phase in ["register", "exchange", "barrier", "steady", "shutdown"] {
        let cpu0: Vec<f64> = pids.iter().map(|p| p.map_or(0.0, cpu_seconds)).collect();
        let log0 = servers.log_index().await;
        let report: PhaseReport = match phase {
            "register" => sim.register().await,
            "exchange" => sim.exchange().await,
            "barrier" => sim.barrier("scale").await,
            "steady" => sim.steady(load.steady).await,
            _ => sim.shutdown().await,
        };
        let log1 = servers.log_index().await;
        let roles = servers.roles().await;
        let servers_use = pids
            .iter()
            .zip(cpu0)
            .zip(roles)
            .map(|((p, c0), role)| ServerUse {
                role,
                cpu_s: p.map_or(0.0, cpu_seconds) - c0,
                rss_mib: p.and_then(|p| rss(p).ok()).unwrap_or(0) as f64 / (1024.0 * 1024.0),
            })
            .collect();
        let errors = report.errors();
        let first_error = report.first_error();
        eprintln!(
            "scale:   {phase}: {:.2} s, {errors} errors{}",
            report.seconds,
            first_error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
        row.phases.push(PhaseRow {
            phase: phase.into(),
            seconds: report.seconds,
            servers: servers_use,
            calls: report.calls,
            errors,
            first_error: first_error.clone(),
            log_entries: log0.zip(log1).map(|(a, b)| b.saturating_sub(a)),
        });
        if errors > 0 && phase != "steady" {
            row.outcome = format!(
                "{phase}: {errors} errors, first: {}",
                first_error.unwrap_or_default()
            );
            break;
        }
    }
}

/// The markdown tables.
pub fn table(rows: &[ScaleRow]) -> String {
    let mut md = String::from(
        "| peer | tasks | jobs | tasks/conn | register s | exchange s | barrier s | shutdown s | job s | outcome |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let secs = |r: &ScaleRow, p: &str| {
        r.phases
            .iter()
            .find(|x| x.phase == p)
            .map_or("–".to_string(), |x| format!("{:.2}", x.seconds))
    };
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.peer,
            r.tasks,
            r.namespaces,
            r.tasks_per_conn,
            secs(r, "register"),
            secs(r, "exchange"),
            secs(r, "barrier"),
            secs(r, "shutdown"),
            r.job_seconds().map_or("–".into(), |s| format!("{s:.2}")),
            r.outcome.replace('|', "/"),
        ));
    }
    md.push_str(
        "\n| peer | tasks | RSS per task beyond empty, bytes (each server) | steady: leader CPU % | steady: log entries/s | p99 ms: register / kv_get_global / barrier / heartbeat / shutdown | CPU s per phase, leader (followers) |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let per_task: Vec<String> = r.rss_per_task().iter().map(|b| format!("{b:.0}")).collect();
        let (cpu, entries) = r.steady().map_or(("–".into(), "–".into()), |(c, e)| {
            (format!("{c:.1}"), format!("{e:.2}"))
        });
        let p99 = |kind: &str| p99_ms(r, kind);
        let cpu_phases: Vec<String> = r.phases.iter().map(phase_cpu).collect();
        md.push_str(&format!(
            "| {} | {} | {} | {cpu} | {entries} | {} / {} / {} / {} / {} | {} |\n",
            r.peer,
            r.tasks,
            per_task.join(", "),
            p99("register"),
            p99("kv_get_global"),
            p99("barrier"),
            p99("heartbeat"),
            p99("shutdown"),
            cpu_phases.join("; "),
        ));
    }
    md
}

/// The largest p99 of `kind` calls over `r`'s phases, ms ("–": none
/// answered).
fn p99_ms(r: &ScaleRow, kind: &str) -> String {
    r.phases
        .iter()
        .filter_map(|p| p.calls.get(kind))
        .filter(|c| c.ok > 0)
        .map(|c| c.p99_ms)
        .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))
        .map_or("–".into(), |v| format!("{v:.0}"))
}

/// A phase's CPU seconds: "phase leader (followers)".
fn phase_cpu(p: &PhaseRow) -> String {
    let lead: f64 = p
        .servers
        .iter()
        .filter(|s| s.role != "follower")
        .map(|s| s.cpu_s)
        .sum();
    let fol: Vec<String> = p
        .servers
        .iter()
        .filter(|s| s.role == "follower")
        .map(|s| format!("{:.1}", s.cpu_s))
        .collect();
    if fol.is_empty() {
        format!("{} {lead:.1}", p.phase)
    } else {
        format!("{} {lead:.1} ({})", p.phase, fol.join(", "))
    }
}

/// The chart: time per phase against N, one line per peer and phase, log
/// scales.
pub fn chart(rows: &[ScaleRow], path: &std::path::Path) -> anyhow::Result<()> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for phase in ["register", "exchange", "barrier", "shutdown"] {
        let mut peers: Vec<&str> = rows.iter().map(|r| r.peer.as_str()).collect();
        peers.dedup();
        peers.sort();
        peers.dedup();
        for peer in peers {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.peer == peer)
                .filter_map(|r| {
                    let p = r
                        .phases
                        .iter()
                        .find(|p| p.phase == phase && p.errors == 0)?;
                    Some((r.tasks as f64, p.seconds.max(1e-3)))
                })
                .collect();
            if !points.is_empty() {
                series.push((format!("{peer}: {phase}"), points));
            }
        }
    }
    crate::report::lines(
        path,
        "Time per phase against tasks (log scales)",
        "tasks",
        "seconds (slowest task)",
        &series,
    )
}
