//! `namespaces`: many jobs on one 3-node cluster. Each task does what a
//! jaxlib task does at the start and end of a job, through the same
//! `xla.coordination` calls: register (with the registration barrier), a KV
//! set and a blocking get of another task's key, a barrier, the shutdown
//! barrier. Tasks dial the namespace's port on the three nodes in turn.
//!
//! - `concurrent`: M namespaces of T tasks each, all at once;
//! - `single`: one namespace of M × T tasks;
//! - `sequential`: the M namespaces one after another.
//!
//! A run's namespaces are created before its clock starts and deleted after
//! it. Then: the RSS an empty namespace costs each node (E namespaces with
//! a port each, every node serving them), and the time from a create sent
//! to a follower to a client registered on the new port of that follower.

use std::time::{Duration, Instant};

use coordstore_tests::wait::eventually;
use coordstore_tests::{free_port_range, node_host, ns, Cluster};
use proto::coordstore::NamespaceInfo;
use proto::xla::coordination_service_client::CoordinationServiceClient;
use proto::xla::{
    BarrierRequest, GetKeyValueRequest, Incarnations, InsertKeyValueRequest, KeyValueEntry,
    RegisterTaskRequest, ShutdownTaskRequest,
};
use tonic::transport::Channel;

use crate::memory::rss;
use crate::peers::channel;
use crate::stats::{summarize, Latency};

/// One timed run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunRow {
    /// `concurrent`, `single` or `sequential`.
    pub run: String,
    /// Namespaces.
    pub namespaces: usize,
    /// Tasks in each.
    pub tasks: usize,
    /// From the first task's registration to the last task's shutdown, s.
    pub seconds: f64,
}

/// What an empty namespace costs a node.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RssRow {
    /// Node id.
    pub node: u64,
    /// Namespaces created.
    pub namespaces: usize,
    /// RSS before, bytes.
    pub before: u64,
    /// RSS with them, bytes.
    pub after: u64,
}

impl RssRow {
    /// Bytes per namespace.
    pub fn each(&self) -> f64 {
        self.after.saturating_sub(self.before) as f64 / self.namespaces.max(1) as f64
    }
}

/// Everything the suite measured.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Results {
    /// The timed runs, in the order they ran.
    pub runs: Vec<RunRow>,
    /// RSS of empty namespaces, per node.
    pub empty: Vec<RssRow>,
    /// Create on a follower → a client registered on its port there.
    pub create_to_registered: Latency,
}

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Namespaces of the concurrent and sequential runs.
    pub namespaces: usize,
    /// Tasks in each.
    pub tasks: usize,
    /// Rounds of the three runs.
    pub rounds: usize,
    /// Empty namespaces for the RSS measurement.
    pub empty: usize,
    /// Create → registered samples.
    pub creates: usize,
}

const WAIT: Duration = Duration::from_secs(600);

/// Runs the suite on a fresh 3-node cluster.
pub async fn run(load: Load) -> anyhow::Result<Results> {
    let hosts: Vec<String> = (0..3).map(node_host).collect();
    let refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let ports = (load.empty.max(load.namespaces) + 16) as u16;
    let (low, high) = free_port_range(&refs, ports);
    let range = format!("{low}-{high}");
    let cluster = Cluster::start_hosts(
        3,
        &[
            "--tasks",
            "1",
            "--heartbeat-timeout-ms",
            "600000",
            "--raft-heartbeat-ms",
            "100",
            "--election-timeout-ms",
            "1000",
            "--namespace-ports",
            &range,
            "--max-parked-calls",
            "1000000",
        ],
    );
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let follower = (leader + 1) % 3;
    let runs = timed_runs(&cluster, leader, load).await?;
    let create_to_registered = create_to_registered(&cluster, follower, load.creates).await?;
    let empty = empty_rss(&cluster, leader, load.empty).await?;
    Ok(Results {
        runs,
        empty,
        create_to_registered,
    })
}

/// `load.rounds` rounds of the single, concurrent and sequential runs.
async fn timed_runs(cluster: &Cluster, leader: usize, load: Load) -> anyhow::Result<Vec<RunRow>> {
    let mut runs = Vec::new();
    for round in 0..load.rounds {
        for run in ["single", "concurrent", "sequential"] {
            let (count, tasks) = match run {
                "single" => (1, load.namespaces * load.tasks),
                _ => (load.namespaces, load.tasks),
            };
            eprintln!("namespaces: round {round}, {run}: {count} × {tasks} tasks");
            let names: Vec<String> = (0..count).map(|i| format!("{run}-{round}-{i}")).collect();
            let jobs = create_all(cluster, leader, &names, tasks).await?;
            let addrs: Vec<Vec<String>> = jobs
                .iter()
                .map(|j| (0..3).map(|i| ns::addr(cluster, i, j)).collect())
                .collect();
            let t0 = Instant::now();
            if run == "sequential" {
                for a in addrs {
                    job(a, tasks).await?;
                }
            } else {
                let all: Vec<_> = addrs
                    .into_iter()
                    .map(|a| tokio::spawn(job(a, tasks)))
                    .collect();
                for j in all {
                    j.await??;
                }
            }
            let seconds = t0.elapsed().as_secs_f64();
            eprintln!("namespaces: {run}: {seconds:.2} s");
            runs.push(RunRow {
                run: run.into(),
                namespaces: count,
                tasks,
                seconds,
            });
            for n in &names {
                ns::delete(&cluster.nodes[leader].addr, n)
                    .await
                    .map_err(|e| anyhow::anyhow!("delete {n}: {e}"))?;
            }
        }
    }
    Ok(runs)
}

/// `creates` times: a namespace created on node `follower`, then a task
/// registered on its port there.
async fn create_to_registered(
    cluster: &Cluster,
    follower: usize,
    creates: usize,
) -> anyhow::Result<Latency> {
    eprintln!("namespaces: create → registered on a follower, {creates} times");
    let mut samples = Vec::new();
    let at = cluster.nodes[follower].addr.clone();
    for i in 0..creates {
        let name = format!("latency-{i}");
        let t0 = Instant::now();
        let info = ns::create(&at, &name, ns::tasks(1))
            .await
            .map_err(|e| anyhow::anyhow!("create {name}: {e}"))?;
        register_when_open(&ns::addr(cluster, follower, &info)).await?;
        samples.push(t0.elapsed());
        ns::delete(&at, &name)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(summarize(&mut samples))
}

/// Every node's RSS before and after `empty` empty namespaces are created.
async fn empty_rss(cluster: &Cluster, leader: usize, empty: usize) -> anyhow::Result<Vec<RssRow>> {
    eprintln!("namespaces: RSS of {empty} empty namespaces");
    let rss_now = |c: &Cluster| -> anyhow::Result<Vec<u64>> {
        c.nodes
            .iter()
            .map(|n| rss(n.pid().ok_or_else(|| anyhow::anyhow!("node down"))?))
            .collect()
    };
    let before = rss_now(cluster)?;
    let names: Vec<String> = (0..empty).map(|i| format!("empty-{i}")).collect();
    create_all(cluster, leader, &names, 1).await?;
    let after = rss_now(cluster)?;
    Ok(cluster
        .nodes
        .iter()
        .zip(before.iter().zip(after))
        .map(|(n, (b, a))| RssRow {
            node: n.id,
            namespaces: empty,
            before: *b,
            after: a,
        })
        .collect())
}

/// Creates namespaces `names` of `tasks` tasks through the leader; returns
/// once every node serves each on its port.
async fn create_all(
    cluster: &Cluster,
    leader: usize,
    names: &[String],
    tasks: usize,
) -> anyhow::Result<Vec<NamespaceInfo>> {
    let at = &cluster.nodes[leader].addr;
    let mut infos = Vec::new();
    for name in names {
        let info = ns::create(at, name, ns::tasks(tasks as u32))
            .await
            .map_err(|e| anyhow::anyhow!("create {name}: {e}"))?;
        infos.push(info);
    }
    for (i, node) in cluster.nodes.iter().enumerate() {
        let what = format!("node {i} to serve all {} namespaces", names.len());
        // A failed list ends the wait, and the run, at once.
        let listed = eventually(what, WAIT, || async {
            let mut c = coordstore_tests::connect(&node.addr, WAIT).await;
            let req = proto::coordstore::ListNamespacesRequest {};
            match c.list_namespaces(req).await {
                Err(e) => Ok(Err(e)),
                Ok(r) => {
                    let serving = r
                        .into_inner()
                        .namespaces
                        .iter()
                        .filter(|n| names.contains(&n.name) && n.listener == "serving")
                        .count();
                    if serving == names.len() {
                        Ok(Ok(()))
                    } else {
                        Err(format!("serves {serving}"))
                    }
                }
            }
        })
        .await;
        listed?;
    }
    Ok(infos)
}

/// Registers task 0 of a one-task job at `addr`, dialing until the port is
/// open.
async fn register_when_open(addr: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(1));
        if let Ok(ch) = ep.connect().await {
            let mut c = CoordinationServiceClient::new(ch);
            let req = RegisterTaskRequest {
                incarnation: 1,
                source_task_id: 0,
            };
            if c.register_task(req).await.is_ok() {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "{addr} never registered a task");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One job: `tasks` tasks in the namespace at `addrs` (its port on each
/// node), task t on node t mod nodes, at most 128 tasks per connection.
async fn job(addrs: Vec<String>, tasks: usize) -> anyhow::Result<()> {
    let nodes = addrs.len();
    let per_node = tasks.div_ceil(nodes).max(1);
    let conns = per_node.div_ceil(128);
    let mut channels: Vec<Vec<Channel>> = Vec::new();
    for addr in &addrs {
        let mut v = Vec::new();
        for _ in 0..conns {
            v.push(channel(addr).await);
        }
        channels.push(v);
    }
    let client = |t: usize| {
        let ch = channels[t % nodes][(t / nodes) % conns].clone();
        CoordinationServiceClient::new(ch)
    };
    // Registration: every task at once (the registration barrier).
    let registered: Vec<_> = (0..tasks)
        .map(|t| {
            let mut c = client(t);
            tokio::spawn(async move {
                let req = RegisterTaskRequest {
                    incarnation: t as u64 + 1,
                    source_task_id: t as i32,
                };
                c.register_task(req).await
            })
        })
        .collect();
    let mut si = 0;
    for r in registered {
        si = tokio::time::timeout(WAIT, r)
            .await???
            .into_inner()
            .service_incarnation;
    }
    let calls: Vec<_> = (0..tasks)
        .map(|t| {
            let mut c = client(t);
            tokio::spawn(async move { one_task(&mut c, si, t, tasks).await })
        })
        .collect();
    for call in calls {
        tokio::time::timeout(WAIT, call).await???;
    }
    Ok(())
}

/// A registered task's part: set, blocking get, barrier, shutdown.
async fn one_task(
    c: &mut CoordinationServiceClient<Channel>,
    si: u64,
    t: usize,
    tasks: usize,
) -> Result<(), tonic::Status> {
    let inc = Some(Incarnations {
        task_id: t as i32,
        task_incarnation: t as u64 + 1,
        service_incarnation: si,
    });
    c.insert_key_value(InsertKeyValueRequest {
        incarnations: inc,
        kv: Some(KeyValueEntry {
            key: format!("addr/{t}"),
            value: format!("task-{t}").into_bytes().into(),
        }),
        allow_overwrite: false,
    })
    .await?;
    c.get_key_value(GetKeyValueRequest {
        incarnations: inc,
        key: format!("addr/{}", (t + 1) % tasks),
    })
    .await?;
    c.barrier(BarrierRequest {
        incarnations: inc,
        barrier_id: "step".into(),
        barrier_timeout_in_ms: 600_000,
        task_ids: Vec::new(),
        source_task_id: t as i32,
        counter: 0,
    })
    .await?;
    c.shutdown_task(ShutdownTaskRequest {
        incarnations: inc,
        source_task_id: t as i32,
    })
    .await?;
    Ok(())
}

/// The markdown table.
pub fn table(r: &Results) -> String {
    let mut md = String::from(
        "| run | namespaces × tasks | seconds (median of rounds) | tasks/s |\n|---|---|---|---|\n",
    );
    let median = |run: &str| {
        let mut v: Vec<f64> = r
            .runs
            .iter()
            .filter(|x| x.run == run)
            .map(|x| x.seconds)
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    for run in ["single", "concurrent", "sequential"] {
        let Some(row) = r.runs.iter().find(|x| x.run == run) else {
            continue;
        };
        let s = median(run);
        md.push_str(&format!(
            "| {run} | {} × {} | {s:.2} | {:.0} |\n",
            row.namespaces,
            row.tasks,
            (row.namespaces * row.tasks) as f64 / s
        ));
    }
    let ratios: Vec<String> = r
        .runs
        .chunks(3)
        .filter(|c| c.len() == 3)
        .map(|c| format!("{:.2}", c[1].seconds / c[0].seconds))
        .collect();
    md.push_str(&format!(
        "\nconcurrent / single, per round: {} (target ≤ 1.5)\n",
        ratios.join(", ")
    ));
    md.push_str("\n| empty namespace, RSS per node | namespaces | KiB each |\n|---|---|---|\n");
    for e in &r.empty {
        md.push_str(&format!(
            "| node {} | {} | {:.1} |\n",
            e.node,
            e.namespaces,
            e.each() / 1024.0
        ));
    }
    let l = &r.create_to_registered;
    md.push_str(&format!(
        "\ncreate on a follower → a client registered on its port there: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms ({} creates; target p50 ≤ 50 ms)\n",
        l.p50_ms, l.p90_ms, l.p99_ms, l.n
    ));
    md
}
