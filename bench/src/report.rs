//! The run's report: machine, per-workload rows, targets; written as JSON
//! (`bench/results/<suite>-<unix time>.json`), as markdown, and as one PNG
//! chart per workload (plotters), every peer side by side.

use std::path::Path;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::barrier::BarrierRow;
use crate::failover::FailoverRow;
use crate::handoff::HandoffRow;
use crate::kv::KvRow;
use crate::memory::MemoryRow;
use crate::peers::PeerKind;
use crate::replay::ReplayRow;

/// What the numbers were measured on.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// Kernel release.
    pub kernel: String,
    /// Load generator's tokio worker threads.
    pub bench_worker_threads: usize,
    /// coordstore commit.
    pub commit: String,
}

impl Machine {
    /// Reads /proc and git.
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kb: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        // A pack of scripts/bench-pack.sh names its commit in COMMIT.
        let commit = std::fs::read_to_string(crate::workspace().join("COMMIT"))
            .ok()
            .or_else(|| {
                std::process::Command::new("git")
                    .args(["rev-parse", "--short", "HEAD"])
                    .current_dir(crate::workspace())
                    .output()
                    .ok()
                    .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            })
            .map(|c| c.trim().to_string())
            .unwrap_or_default();
        Machine {
            cpu,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_gib: (kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel,
            bench_worker_threads: crate::load_threads(),
            commit,
        }
    }

    /// One markdown line.
    pub fn line(&self) -> String {
        format!(
            "Machine: {} × {}, {} GiB, Linux {}; servers, clients and the load generator ({} tokio workers) share it; coordstore {}.",
            self.cpus, self.cpu, self.memory_gib, self.kernel, self.bench_worker_threads, self.commit
        )
    }
}

/// A target of the issue and where coordstore stands.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// What.
    pub target: String,
    /// The measured figure.
    pub measured: String,
    /// Met?
    pub met: bool,
}

/// Everything one run measured.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// Unix time the run started.
    pub started_unix: u64,
    /// KV put/get rows.
    pub kv: Vec<KvRow>,
    /// Blocking-get hand-off rows.
    pub handoff: Vec<HandoffRow>,
    /// Barrier rows.
    pub barrier: Vec<BarrierRow>,
    /// Failover rows.
    pub failover: Vec<FailoverRow>,
    /// Restart replay rows.
    pub replay: Vec<ReplayRow>,
    /// Memory rows.
    pub memory: Vec<MemoryRow>,
    /// Put throughput with parked blocking gets.
    #[serde(default)]
    pub parked: Vec<crate::parked::ParkedRow>,
    /// Targets.
    pub targets: Vec<Target>,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

impl Report {
    /// Evaluates the targets on what was measured.
    pub fn evaluate(&mut self) {
        let mut t = self.kv_targets();
        t.extend(self.time_targets());
        t.extend(self.resource_targets());
        self.targets = t;
    }

    /// The KV targets: put throughput and latency, and get latency, beside
    /// etcd's.
    fn kv_targets(&self) -> Vec<Target> {
        let cs3 = PeerKind::Coordstore3.name();
        let etcd = PeerKind::Etcd3.name();
        let kv = |peer: &str, op: &str, clients: usize| {
            self.kv
                .iter()
                .find(|r| r.peer == peer && r.op == op && r.clients == clients)
        };
        let mut t = Vec::new();
        if let (Some(a), Some(b)) = (kv(cs3, "put", 64), kv(etcd, "put", 64)) {
            let ratio = a.ops_per_s / b.ops_per_s;
            t.push(Target {
                target: "KV put at 64 clients ≥ 1.5× etcd's ops/s".into(),
                measured: format!(
                    "{:.0} vs {:.0} ops/s = {ratio:.2}×",
                    a.ops_per_s, b.ops_per_s
                ),
                met: ratio >= 1.5,
            });
        }
        if let (Some(a), Some(b)) = (kv(cs3, "put", 1), kv(etcd, "put", 1)) {
            t.push(Target {
                target: "KV put p50 at 1 client ≤ etcd's".into(),
                measured: format!("{:.2} vs {:.2} ms", a.latency.p50_ms, b.latency.p50_ms),
                met: a.latency.p50_ms <= b.latency.p50_ms,
            });
        }
        if let (Some(a), Some(b)) = (kv(cs3, "get", 1), kv(etcd, "get", 1)) {
            t.push(Target {
                target: "linearizable get p50 at 1 client ≤ etcd's (3 nodes)".into(),
                measured: format!("{:.2} vs {:.2} ms", a.latency.p50_ms, b.latency.p50_ms),
                met: a.latency.p50_ms <= b.latency.p50_ms,
            });
        }
        t
    }

    /// The targets in time: barrier rounds, failover, restart replay.
    fn time_targets(&self) -> Vec<Target> {
        let cs3 = PeerKind::Coordstore3.name();
        let mut t = Vec::new();
        for r in self
            .barrier
            .iter()
            .filter(|r| r.tasks == 1024 && r.peer.starts_with("coordstore"))
        {
            t.push(Target {
                target: format!("barrier of 1024 tasks p50 ≤ 50 ms ({})", r.peer),
                measured: format!("{:.1} ms", r.round.p50_ms),
                met: r.round.p50_ms <= 50.0,
            });
        }
        for r in self.failover.iter().filter(|r| r.peer == cs3) {
            t.push(Target {
                target: "failover p50 ≤ 1.5 s".into(),
                measured: format!("{:.0} ms over {} kills", r.failover.p50_ms, r.kills),
                met: r.failover.p50_ms <= 1500.0,
            });
        }
        for r in self
            .replay
            .iter()
            .filter(|r| r.peer.starts_with("coordstore"))
        {
            t.push(Target {
                target: format!(
                    "node with {} journal entries serving within 3 s ({})",
                    r.entries, r.case
                ),
                measured: format!("{:.0} ms", r.serving_ms),
                met: r.serving_ms <= 3000.0,
            });
        }
        t
    }

    /// The targets on resources: memory, and put throughput with parked
    /// gets.
    fn resource_targets(&self) -> Vec<Target> {
        let mut t = Vec::new();
        for r in self
            .memory
            .iter()
            .filter(|r| r.peer.starts_with("coordstore"))
        {
            t.push(Target {
                target: format!("RSS ≤ 1.5× raw data ({})", r.peer),
                measured: format!(
                    "{:.0} MiB for {:.0} MiB = {:.2}×",
                    mib(r.rss_leader),
                    mib(r.raw_bytes),
                    r.ratio
                ),
                met: r.ratio <= 1.5,
            });
        }
        for r in self.parked.iter().filter(|r| r.parked > 0) {
            let base = self
                .parked
                .iter()
                .find(|b| b.peer == r.peer && b.parked == 0 && b.put.clients == r.put.clients);
            if let Some(b) = base {
                let ratio = r.put.ops_per_s / b.put.ops_per_s;
                t.push(Target {
                    target: format!(
                        "put with {} parked gets ≥ 0.9× put with none ({}, {} clients)",
                        r.parked, r.peer, r.put.clients
                    ),
                    measured: format!(
                        "{:.0} vs {:.0} ops/s = {ratio:.2}×",
                        r.put.ops_per_s, b.put.ops_per_s
                    ),
                    met: ratio >= 0.9,
                });
            }
        }
        t
    }

    /// The markdown tables of every workload measured.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        s.push_str(&self.machine.line());
        s.push_str("\n\n");
        self.targets_markdown(&mut s);
        self.kv_markdown(&mut s);
        self.handoff_markdown(&mut s);
        self.barrier_markdown(&mut s);
        self.failover_markdown(&mut s);
        self.replay_markdown(&mut s);
        self.parked_markdown(&mut s);
        self.memory_markdown(&mut s);
        s
    }

    /// Appends the markdown of the targets and whether they were met.
    fn targets_markdown(&self, s: &mut String) {
        if self.targets.is_empty() {
            return;
        }
        s.push_str("| target | measured | met |\n|---|---|---|\n");
        for t in &self.targets {
            s.push_str(&format!(
                "| {} | {} | {} |\n",
                t.target,
                t.measured,
                if t.met { "yes" } else { "**no**" }
            ));
        }
        s.push('\n');
    }

    /// Appends the KV table, and where the leader's puts spent their time.
    fn kv_markdown(&self, s: &mut String) {
        if self.kv.is_empty() {
            return;
        }
        s.push_str("**KV** (256-byte values, clients on the leader; get = linearizable)\n\n| peer | op | clients / conns | ops/s | p50 ms | p99 ms | errors | server CPU µs/op |\n|---|---|---|---|---|---|---|---|\n");
        for r in &self.kv {
            s.push_str(&format!(
                "| {} | {} | {} / {} | {:.0} | {:.2} | {:.2} | {} | {} |\n",
                r.peer,
                r.op,
                r.clients,
                r.connections,
                r.ops_per_s,
                r.latency.p50_ms,
                r.latency.p99_ms,
                r.errors,
                r.server_cpu_us.map_or("-".into(), |c| format!("{c:.0}"))
            ));
        }
        s.push('\n');
        let staged: Vec<_> = self
            .kv
            .iter()
            .filter_map(|r| Some((r, r.stages.as_ref()?)))
            .collect();
        if !staged.is_empty() {
            s.push_str("**Where the leader's puts spent their time** (means over the measured seconds, from its `/metrics`: `queue` in the write batcher, `commit` a batch from proposal to answer, `resume` the answer until the handler runs; µs)\n\n| peer | clients | queue | commit | resume | updates per entry | fdatasync | apply a run |\n|---|---|---|---|---|---|---|---|\n");
            let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
            for (r, st) in staged {
                s.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    r.peer,
                    r.clients,
                    f(st.queue_us),
                    f(st.commit_us),
                    f(st.resume_us),
                    st.updates_per_entry
                        .map_or("-".into(), |v| format!("{v:.1}")),
                    f(st.fdatasync_us),
                    f(st.apply_us),
                ));
            }
            s.push('\n');
        }
    }

    /// Appends the markdown of blocking-get hand-off latency.
    fn handoff_markdown(&self, s: &mut String) {
        if self.handoff.is_empty() {
            return;
        }
        s.push_str("**Blocking-get hand-off** (set start → waiter woken)\n\n| peer | p50 ms | p90 ms | p99 ms | n |\n|---|---|---|---|---|\n");
        for r in &self.handoff {
            s.push_str(&format!(
                "| {} | {:.2} | {:.2} | {:.2} | {} |\n",
                r.peer, r.latency.p50_ms, r.latency.p90_ms, r.latency.p99_ms, r.latency.n
            ));
        }
        s.push('\n');
    }

    /// Appends the markdown of barrier rounds.
    fn barrier_markdown(&self, s: &mut String) {
        if self.barrier.is_empty() {
            return;
        }
        s.push_str("**Barrier** (all N tasks call at once; round = until the last returns)\n\n| peer | N | conns | register all ms | round p50 ms | p99 ms | rounds |\n|---|---|---|---|---|---|---|\n");
        for r in &self.barrier {
            s.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {} |\n",
                r.peer,
                r.tasks,
                r.connections,
                r.register_ms,
                r.round.p50_ms,
                r.round.p99_ms,
                r.round.n
            ));
        }
        s.push('\n');
    }

    /// Appends the markdown of failovers.
    fn failover_markdown(&self, s: &mut String) {
        if self.failover.is_empty() {
            return;
        }
        s.push_str("**Failover** (SIGKILL of the leader under writes → first acknowledged put sent after the kill)\n\n| peer | kills | p50 ms | p90 ms | max ms |\n|---|---|---|---|---|\n");
        for r in &self.failover {
            let max = r.samples_ms.iter().copied().fold(0.0, f64::max);
            s.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.0} |\n",
                r.peer, r.kills, r.failover.p50_ms, r.failover.p90_ms, max
            ));
        }
        s.push('\n');
    }

    /// Appends the markdown of restart replay.
    fn replay_markdown(&self, s: &mut String) {
        if self.replay.is_empty() {
            return;
        }
        s.push_str("**Restart replay** (SIGKILL, restart → first linearizable read of the last entry's value)\n\n| peer | case | journal entries | log entries on disk | data dir MiB | serving after ms |\n|---|---|---|---|---|---|\n");
        for r in &self.replay {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.0} | {:.0} |\n",
                r.peer,
                r.case,
                r.entries,
                r.log_entries.map_or("–".to_string(), |n| n.to_string()),
                mib(r.data_dir_bytes),
                r.serving_ms
            ));
        }
        s.push('\n');
    }

    /// Appends the markdown of put throughput with parked blocking gets.
    fn parked_markdown(&self, s: &mut String) {
        if self.parked.is_empty() {
            return;
        }
        s.push_str("**Parked blocking gets** (KV put, 256-byte values, while N blocking gets of unwritten keys are parked on the node)\n\n| peer | parked gets | clients | put ops/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|---|\n");
        for r in &self.parked {
            s.push_str(&format!(
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {} |\n",
                r.peer,
                r.parked,
                r.put.clients,
                r.put.ops_per_s,
                r.put.latency.p50_ms,
                r.put.latency.p99_ms,
                r.put.errors
            ));
        }
        s.push('\n');
    }

    /// Appends the markdown of memory.
    fn memory_markdown(&self, s: &mut String) {
        if self.memory.is_empty() {
            return;
        }
        s.push_str("**Memory** (keys of 1 KiB put through the leader by 64 clients; VmRSS 3 s after the load)\n\n| peer | raw data MiB | RSS before MiB | leader RSS MiB | max RSS MiB | RSS / raw | growth / raw |\n|---|---|---|---|---|---|---|\n");
        for r in &self.memory {
            s.push_str(&format!(
                "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |\n",
                r.peer,
                mib(r.raw_bytes),
                mib(r.rss_before),
                mib(r.rss_leader),
                mib(r.rss_max),
                r.ratio,
                r.growth_ratio
            ));
        }
        s.push('\n');
    }

    /// Writes one PNG per measured workload into `dir`; returns the files.
    pub fn charts(&self, dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
        register_font()?;
        let mut charts = Charts {
            dir,
            files: Vec::new(),
        };
        self.kv_charts(&mut charts)?;
        self.time_charts(&mut charts)?;
        self.memory_chart(&mut charts)?;
        Ok(charts.files)
    }

    /// The KV charts: put throughput and p50, get throughput.
    fn kv_charts(&self, charts: &mut Charts<'_>) -> anyhow::Result<()> {
        let clients = |c: &usize| format!("{c} client{}", if *c == 1 { "" } else { "s" });
        for (op, file, title, ylabel, p50) in [
            (
                "put",
                "kv_put.png",
                "KV put throughput (256 B values)",
                "ops/s",
                false,
            ),
            ("put", "kv_put_p50.png", "KV put latency p50", "ms", true),
            (
                "get",
                "kv_get.png",
                "Linearizable get throughput",
                "ops/s",
                false,
            ),
        ] {
            let rows: Vec<&KvRow> = self.kv.iter().filter(|r| r.op == op).collect();
            if !rows.is_empty() {
                let g = Grid::sorted(
                    &rows,
                    |r| &r.peer,
                    |r| r.clients,
                    clients,
                    |r| {
                        if p50 {
                            r.latency.p50_ms
                        } else {
                            r.ops_per_s
                        }
                    },
                );
                charts.add(file, title, ylabel, g, false)?;
            }
        }
        Ok(())
    }

    /// The charts in time: hand-off, barrier rounds, failover, replay.
    fn time_charts(&self, charts: &mut Charts<'_>) -> anyhow::Result<()> {
        if !self.handoff.is_empty() {
            let g = Grid::percentiles(
                &self.handoff,
                |r| &r.peer,
                |r| [r.latency.p50_ms, r.latency.p90_ms, r.latency.p99_ms],
            );
            charts.add("handoff.png", "Blocking-get hand-off", "ms", g, false)?;
        }
        if !self.barrier.is_empty() {
            let g = Grid::sorted(
                &self.barrier.iter().collect::<Vec<_>>(),
                |r| &r.peer,
                |r| r.tasks,
                |n| format!("N = {n}"),
                |r| r.round.p50_ms,
            );
            charts.add(
                "barrier.png",
                "Barrier round p50 (log scale)",
                "ms",
                g,
                true,
            )?;
        }
        if !self.failover.is_empty() {
            let mut g = Grid::percentiles(
                &self.failover,
                |r| &r.peer,
                |r| {
                    let max = r.samples_ms.iter().copied().fold(0.0, f64::max);
                    [r.failover.p50_ms, r.failover.p90_ms, max]
                },
            );
            g.labels[2] = "max".into();
            let title = "Leader SIGKILL → writes succeed again";
            charts.add("failover.png", title, "ms", g, false)?;
        }
        if !self.replay.is_empty() {
            let g = Grid::in_order(
                &self.replay.iter().collect::<Vec<_>>(),
                |r| &r.peer,
                |r| r.case.clone(),
                |r| r.serving_ms,
            );
            let title = format!(
                "{} journal entries: restart → serving",
                self.replay[0].entries
            );
            charts.add("replay.png", &title, "ms", g, false)?;
        }
        Ok(())
    }

    /// The memory chart.
    fn memory_chart(&self, charts: &mut Charts<'_>) -> anyhow::Result<()> {
        if !self.memory.is_empty() {
            // Groups are the peers here, series the three figures.
            let pick = |f: fn(&MemoryRow) -> u64| -> Vec<Option<f64>> {
                self.memory.iter().map(|r| Some(mib(f(r)))).collect()
            };
            let g = Grid {
                labels: self.memory.iter().map(|r| r.peer.clone()).collect(),
                series: vec![
                    ("raw data".into(), pick(|r| r.raw_bytes)),
                    ("leader RSS".into(), pick(|r| r.rss_leader)),
                    (
                        "RSS growth".into(),
                        pick(|r| r.rss_leader.saturating_sub(r.rss_before)),
                    ),
                ],
            };
            let title = format!(
                "RSS holding {} keys ({:.0} MiB of keys and values)",
                self.memory[0].keys,
                mib(self.memory[0].raw_bytes)
            );
            charts.add("memory.png", &title, "MiB", g, false)?;
        }
        Ok(())
    }
}

/// The charts of one report, as they are written.
struct Charts<'a> {
    /// Where they go.
    dir: &'a Path,
    /// The files written so far.
    files: Vec<std::path::PathBuf>,
}

impl Charts<'_> {
    /// Writes `g` as the grouped bar chart `file` (`log_y`: a log scale).
    fn add(
        &mut self,
        file: &str,
        title: &str,
        ylabel: &str,
        g: Grid,
        log_y: bool,
    ) -> anyhow::Result<()> {
        let path = self.dir.join(file);
        bars(&path, title, ylabel, &g.labels, &g.series, log_y)?;
        self.files.push(path);
        Ok(())
    }
}

/// A grouped bar chart's data: group labels, and one series per peer with
/// a value (or none) per group.
struct Grid {
    labels: Vec<String>,
    series: Vec<(String, Vec<Option<f64>>)>,
}

impl Grid {
    /// Groups are the distinct `group(row)` values in first-seen order;
    /// series the peers in first-seen order.
    fn in_order<R, G: PartialEq + Clone + ToString>(
        rows: &[&R],
        peer: impl Fn(&R) -> &String,
        group: impl Fn(&R) -> G,
        value: impl Fn(&R) -> f64,
    ) -> Grid {
        let mut groups: Vec<G> = Vec::new();
        for r in rows {
            let g = group(r);
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        let labels = groups.iter().map(G::to_string).collect();
        Self::build(rows, &peer, &group, &value, groups, labels)
    }

    /// As [`Grid::in_order`] with the groups sorted and labelled by `label`.
    fn sorted<R, G: Ord + Clone>(
        rows: &[&R],
        peer: impl Fn(&R) -> &String,
        group: impl Fn(&R) -> G,
        label: impl Fn(&G) -> String,
        value: impl Fn(&R) -> f64,
    ) -> Grid {
        let mut groups: Vec<G> = rows.iter().map(|r| group(r)).collect();
        groups.sort();
        groups.dedup();
        let labels = groups.iter().map(label).collect();
        Self::build(rows, &peer, &group, &value, groups, labels)
    }

    /// Three groups p50 / p90 / p99, one series per row.
    fn percentiles<R>(
        rows: &[R],
        peer: impl Fn(&R) -> &String,
        values: impl Fn(&R) -> [f64; 3],
    ) -> Grid {
        Grid {
            labels: vec!["p50".into(), "p90".into(), "p99".into()],
            series: rows
                .iter()
                .map(|r| (peer(r).clone(), values(r).map(Some).to_vec()))
                .collect(),
        }
    }

    fn build<R, G: PartialEq>(
        rows: &[&R],
        peer: &impl Fn(&R) -> &String,
        group: &impl Fn(&R) -> G,
        value: &impl Fn(&R) -> f64,
        groups: Vec<G>,
        labels: Vec<String>,
    ) -> Grid {
        let mut peers: Vec<&String> = Vec::new();
        for r in rows {
            if !peers.contains(&peer(r)) {
                peers.push(peer(r));
            }
        }
        let series = peers
            .into_iter()
            .map(|p| {
                let vals = groups
                    .iter()
                    .map(|g| {
                        rows.iter()
                            .find(|r| peer(r) == p && group(r) == *g)
                            .map(|r| value(r))
                    })
                    .collect();
                (p.clone(), vals)
            })
            .collect();
        Grid { labels, series }
    }
}

fn register_font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let path = crate::tools().map_err(|e| e.to_string())?.font.clone();
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{}: not a usable font", path.display()))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(214, 39, 40),
];

/// A line chart with log scales on both axes: one line (with points) per
/// series of (x, y) pairs.
pub fn lines(
    path: &Path,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    register_font()?;
    let points = || series.iter().flat_map(|(_, v)| v.iter());
    let (x_lo, x_hi) = points().fold((f64::INFINITY, 0f64), |(lo, hi), (x, _)| {
        (lo.min(*x), hi.max(*x))
    });
    let (y_lo, y_hi) = points().fold((f64::INFINITY, 0f64), |(lo, hi), (_, y)| {
        (lo.min(*y), hi.max(*y))
    });
    anyhow::ensure!(x_hi > 0.0 && y_hi > 0.0, "nothing to draw");
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            ((x_lo / 1.5)..(x_hi * 1.5)).log_scale(),
            ((y_lo / 2.0).max(1e-4)..(y_hi * 2.0)).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    for (si, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(si).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// A grouped bar chart: one group per label, one bar per series in it.
fn bars(
    path: &Path,
    title: &str,
    ylabel: &str,
    labels: &[String],
    series: &[(String, Vec<Option<f64>>)],
    log_y: bool,
) -> anyhow::Result<()> {
    let values = || series.iter().flat_map(|(_, v)| v.iter().flatten()).copied();
    let max = values().fold(0.0f64, f64::max).max(1e-3);
    let min_pos = values().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
    let root = BitMapBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = labels.len().max(1);
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 26))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    if log_y {
        let lo = (min_pos / 2.0).max(1e-3);
        let chart = builder.build_cartesian_2d(0f64..n as f64, (lo..max * 2.0).log_scale())?;
        draw_bars(chart, lo, ylabel, labels, series)?;
    } else {
        let chart = builder.build_cartesian_2d(0f64..n as f64, 0f64..max * 1.15)?;
        draw_bars(chart, 0.0, ylabel, labels, series)?;
    }
    root.present()?;
    Ok(())
}

/// Draws the bars (from `base` up) and the legend on `chart`.
fn draw_bars<'a, Y>(
    mut chart: ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    base: f64,
    ylabel: &str,
    labels: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let n = labels.len().max(1);
    // Group g spans [g, g + 1); its label sits at g + 0.5 (a 0.5-step mesh).
    let label_of = |x: &f64| -> String {
        let i = x.floor() as usize;
        if (x - x.floor() - 0.5).abs() < 1e-6 && i < labels.len() {
            labels[i].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(2 * n + 1)
        .x_label_formatter(&label_of)
        .y_desc(ylabel)
        .draw()?;
    let per = series.len().max(1) as f64;
    for (si, (name, vals)) in series.iter().enumerate() {
        let color = COLORS[si % COLORS.len()];
        chart
            .draw_series(vals.iter().enumerate().filter_map(|(g, v)| {
                v.map(|v| {
                    let x0 = g as f64 + 0.1 + 0.8 * si as f64 / per;
                    Rectangle::new(
                        [(x0, base), (x0 + 0.8 / per * 0.9, v.max(base))],
                        color.filled(),
                    )
                })
            }))?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Latency;

    fn lat(p50: f64) -> Latency {
        Latency {
            n: 10,
            p50_ms: p50,
            p90_ms: p50 * 1.5,
            p99_ms: p50 * 2.0,
        }
    }

    fn put(peer: PeerKind, clients: usize, ops: f64, p50: f64) -> KvRow {
        KvRow {
            peer: peer.name().into(),
            op: "put".into(),
            clients,
            connections: crate::kv::connections(clients),
            seconds: 5.0,
            ops_per_s: ops,
            errors: 0,
            latency: lat(p50),
            server_cpu_us: None,
            stages: None,
        }
    }

    #[test]
    fn targets_compare_coordstore_with_etcd_in_the_same_run() {
        let mut r = Report {
            kv: vec![
                put(PeerKind::Coordstore3, 1, 800.0, 1.2),
                put(PeerKind::Coordstore3, 64, 15000.0, 4.0),
                put(PeerKind::Etcd3, 1, 1500.0, 0.6),
                put(PeerKind::Etcd3, 64, 10000.0, 5.0),
            ],
            failover: vec![FailoverRow {
                peer: PeerKind::Coordstore3.name().into(),
                kills: 10,
                failover: lat(1200.0),
                samples_ms: vec![1200.0; 10],
            }],
            memory: vec![MemoryRow {
                peer: PeerKind::Coordstore1.name().into(),
                keys: 100,
                raw_bytes: 100 << 20,
                rss_before: 10 << 20,
                rss_leader: 250 << 20,
                rss_max: 250 << 20,
                ratio: 2.5,
                growth_ratio: 2.4,
            }],
            ..Default::default()
        };
        r.evaluate();
        let met: Vec<(&str, bool)> = r
            .targets
            .iter()
            .map(|t| (t.target.as_str(), t.met))
            .collect();
        assert_eq!(
            met,
            vec![
                ("KV put at 64 clients ≥ 1.5× etcd's ops/s", true),
                ("KV put p50 at 1 client ≤ etcd's", false),
                ("failover p50 ≤ 1.5 s", true),
                ("RSS ≤ 1.5× raw data (coordstore 1 node)", false),
            ]
        );
        assert!(
            r.targets[0].measured.contains("1.50×"),
            "{:?}",
            r.targets[0]
        );
        let md = r.markdown();
        assert!(md.contains("| coordstore 3 nodes | put | 64 / 8 | 15000 | 4.00 | 8.00 | 0 |"));
        assert!(md.contains("| KV put p50 at 1 client ≤ etcd's | 1.20 vs 0.60 ms | **no** |"));
    }

    #[test]
    fn grid_has_a_series_per_peer_and_a_gap_where_a_peer_was_not_measured() {
        let rows = [
            put(PeerKind::Etcd3, 64, 3.0, 1.0),
            put(PeerKind::Coordstore3, 64, 2.0, 1.0),
            put(PeerKind::Coordstore3, 1, 1.0, 1.0),
        ];
        let refs: Vec<&KvRow> = rows.iter().collect();
        let g = Grid::sorted(
            &refs,
            |r| &r.peer,
            |r| r.clients,
            |c| c.to_string(),
            |r| r.ops_per_s,
        );
        assert_eq!(g.labels, vec!["1", "64"]);
        assert_eq!(
            g.series,
            vec![
                (PeerKind::Etcd3.name().to_string(), vec![None, Some(3.0)]),
                (
                    PeerKind::Coordstore3.name().to_string(),
                    vec![Some(1.0), Some(2.0)]
                ),
            ]
        );
    }

    #[test]
    fn a_target_without_both_peers_measured_is_not_reported() {
        let mut r = Report {
            kv: vec![put(PeerKind::Coordstore3, 64, 15000.0, 4.0)],
            ..Default::default()
        };
        r.evaluate();
        assert!(r.targets.is_empty(), "{:?}", r.targets);
    }
}
