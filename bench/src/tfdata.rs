//! `tfdata`: the tf.data service dispatcher's call latency, coordstore (1
//! node, and 3 nodes with the client on the leader and on a follower) beside
//! TensorFlow 2.21's own dispatcher in memory and with `fault_tolerant_mode`
//! (journaled in a work dir: the durable peer), in one run. The calls are
//! the ones a training job repeats: ClientHeartbeat (every client, every
//! second), GetOrCreateJob of a named job that exists (every client of a
//! shared job), WorkerHeartbeat of a known worker, and GetSplit of a DYNAMIC
//! iteration (one worker pulling splits; each split is journaled, fsync'd,
//! on both the fault-tolerant TF dispatcher and coordstore), and the splits
//! per second that 16, 64 and 256 workers pulling at once get (each on its
//! own connection, as tf.data workers are). Targets: calls within 2× of
//! TF's fault-tolerant dispatcher; splits/s ≥ 1.5× of it at 64 callers and
//! ≥ 2× at 256.

use std::time::{Duration, Instant};

use coordstore_tests::jax::{tf_python, PyProc};
use coordstore_tests::{free_port, wire, Cluster};
use proto::tfdata::dispatcher_service_client::DispatcherServiceClient;
use proto::tfdata::*;
use tonic::transport::Channel;

use crate::stats::{summarize, Latency};

/// One peer's latency per call.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// Peer name.
    pub peer: String,
    /// Call name.
    pub call: String,
    /// Latency.
    pub latency: Latency,
    /// GetSplit only: (callers, splits handed out per second) with that
    /// many workers pulling at once.
    pub splits_per_s: Vec<(usize, f64)>,
}

/// How the split throughput is measured.
#[derive(Clone, Debug)]
pub struct SplitLoad {
    /// Caller counts (workers pulling at once, a connection each).
    pub callers: Vec<usize>,
    /// Seconds per caller count.
    pub seconds: f64,
}

const CALLS: [&str; 4] = [
    "ClientHeartbeat",
    "GetOrCreateJob",
    "WorkerHeartbeat",
    "GetSplit",
];

/// The iteration id of a DYNAMIC job's first iteration, as the worker
/// learns it: from the TaskDef its heartbeat gets.
async fn dynamic_iteration(
    c: &mut DispatcherServiceClient<Channel>,
    job_id: i64,
    worker: WorkerHeartbeatRequest,
) -> anyhow::Result<i64> {
    let hb = c.worker_heartbeat(worker).await?.into_inner();
    let _ = job_id;
    hb.new_tasks
        .iter()
        .filter(|t| t.num_split_providers > 0)
        .map(|t| t.iteration_id)
        .max()
        .ok_or_else(|| anyhow::anyhow!("no DYNAMIC task in the worker heartbeat"))
}

/// TF's own dispatcher (in memory, or journaled in a work dir), and the
/// serialized DatasetDef it printed.
fn tf_dispatcher(work_dir: Option<&std::path::Path>) -> anyhow::Result<(PyProc, String, Vec<u8>)> {
    let port = free_port().to_string();
    let mut args = vec!["--port".to_string(), port.clone()];
    if let Some(d) = work_dir {
        args.extend(["--work-dir".to_string(), d.display().to_string()]);
    }
    let logs = std::env::temp_dir();
    let mut p = PyProc::spawn_with(&tf_python(), "tfdata_dispatcher.py", &args, &logs, &[]);
    p.wait_line("READY", Duration::from_secs(120));
    let hex = p
        .lines()
        .iter()
        .find_map(|l| l.strip_prefix("DATASET ").map(str::to_string))
        .ok_or_else(|| anyhow::anyhow!("no dataset from the TF dispatcher"))?;
    let def = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()?;
    Ok((p, format!("127.0.0.1:{port}"), def))
}

/// Sets up a dataset, a named job, an iteration client and a worker on
/// `addr`, then times `iterations` sequential calls of each kind.
async fn measure(
    peer: &str,
    addr: &str,
    dataset_def: &[u8],
    iterations: usize,
    load: &SplitLoad,
) -> anyhow::Result<Vec<Row>> {
    let mut c: DispatcherServiceClient<Channel> =
        DispatcherServiceClient::new(wire::channel(addr).await);
    let Requests {
        heartbeat,
        job,
        worker,
        split,
    } = set_up(&mut c, dataset_def).await?;
    let mut rows = Vec::new();
    for call in CALLS {
        let mut samples = Vec::with_capacity(iterations);
        for i in 0..iterations + 20 {
            let t = Instant::now();
            match call {
                "ClientHeartbeat" => drop(c.client_heartbeat(heartbeat).await?),
                "GetOrCreateJob" => drop(c.get_or_create_job(job.clone()).await?),
                "GetSplit" => {
                    let r = c.get_split(split).await?.into_inner();
                    anyhow::ensure!(!r.end_of_splits, "{peer}: out of splits");
                }
                _ => drop(c.worker_heartbeat(worker.clone()).await?),
            }
            // The first 20 calls warm up.
            if i >= 20 {
                samples.push(t.elapsed());
            }
        }
        let mut splits_per_s = Vec::new();
        if call == "GetSplit" {
            for &callers in &load.callers {
                let rate = split_throughput(addr, split, callers, load.seconds).await?;
                eprintln!("tfdata: {peer}: {callers} callers, {rate:.0} splits/s");
                splits_per_s.push((callers, rate));
            }
        }
        rows.push(Row {
            peer: peer.into(),
            call: call.into(),
            latency: summarize(&mut samples),
            splits_per_s,
        });
    }
    Ok(rows)
}

/// The requests [`measure`] times: a client's heartbeat in an iteration of
/// a named job, that job's get-or-create, a worker's heartbeat, and a split
/// of a DYNAMIC job of the same dataset.
struct Requests {
    heartbeat: ClientHeartbeatRequest,
    job: GetOrCreateJobRequest,
    worker: WorkerHeartbeatRequest,
    split: GetSplitRequest,
}

/// Sets up a dataset, a named job, an iteration client, a worker and a
/// DYNAMIC job through `c`; the requests to time.
async fn set_up(
    c: &mut DispatcherServiceClient<Channel>,
    dataset_def: &[u8],
) -> anyhow::Result<Requests> {
    let dataset_id = c
        .get_or_register_dataset(GetOrRegisterDatasetRequest {
            dataset: dataset_def.to_vec().into(),
            // DataServiceMetadata { compression: OFF }.
            metadata: b"\x10\x01".to_vec().into(),
            optional_dataset_id: None,
        })
        .await?
        .into_inner()
        .dataset_id;
    let worker = WorkerHeartbeatRequest {
        worker_address: "127.0.0.1:1".into(),
        ..Default::default()
    };
    c.worker_heartbeat(worker.clone()).await?;
    let job = GetOrCreateJobRequest {
        dataset_id,
        processing_mode_def: Some(ProcessingModeDef { sharding_policy: 0 }),
        optional_job_name: Some(get_or_create_job_request::OptionalJobName::JobName(
            "bench".into(),
        )),
        ..Default::default()
    };
    let job_id = c.get_or_create_job(job.clone()).await?.into_inner().job_id;
    let client_id = c
        .get_or_create_iteration(GetOrCreateIterationRequest {
            job_id,
            repetition: 1,
        })
        .await?
        .into_inner()
        .iteration_client_id;
    let heartbeat = ClientHeartbeatRequest {
        iteration_client_id: client_id,
        ..Default::default()
    };
    // A DYNAMIC job of the same dataset, for GetSplit.
    let dynamic = GetOrCreateJobRequest {
        processing_mode_def: Some(ProcessingModeDef { sharding_policy: 1 }),
        optional_job_name: Some(get_or_create_job_request::OptionalJobName::JobName(
            "bench-dynamic".into(),
        )),
        ..job.clone()
    };
    let dynamic_job = c.get_or_create_job(dynamic).await?.into_inner().job_id;
    c.get_or_create_iteration(GetOrCreateIterationRequest {
        job_id: dynamic_job,
        repetition: 1,
    })
    .await?;
    let iteration_id = dynamic_iteration(c, dynamic_job, worker.clone()).await?;
    let split = GetSplitRequest {
        iteration_id,
        repetition: 0,
        split_provider_index: 0,
    };
    Ok(Requests {
        heartbeat,
        job,
        worker,
        split,
    })
}

/// Splits per second that `callers` callers, each on its own connection,
/// get pulling at once for `seconds`.
async fn split_throughput(
    addr: &str,
    split: GetSplitRequest,
    callers: usize,
    seconds: f64,
) -> anyhow::Result<f64> {
    let mut clients = Vec::with_capacity(callers);
    for _ in 0..callers {
        clients.push(DispatcherServiceClient::new(wire::channel(addr).await));
    }
    let start = tokio::sync::Barrier::new(callers + 1);
    let start = std::sync::Arc::new(start);
    let mut tasks = Vec::new();
    for mut c in clients {
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let end = Instant::now() + Duration::from_secs_f64(seconds);
            let mut n = 0u64;
            while Instant::now() < end {
                let r = c.get_split(split).await?.into_inner();
                anyhow::ensure!(!r.end_of_splits, "out of splits");
                n += 1;
            }
            Ok(n)
        }));
    }
    start.wait().await;
    let started = Instant::now();
    let mut splits = 0;
    for t in tasks {
        splits += t.await??;
    }
    Ok(splits as f64 / started.elapsed().as_secs_f64())
}

/// Restart after a history of `entries` journaled jobs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RestartRow {
    /// Peer name.
    pub peer: String,
    /// Journal entries written before the restart.
    pub entries: usize,
    /// From the restart to serving, ms (TF: the DispatchServer constructor,
    /// which replays its journal; coordstore: from spawning the process to
    /// its first answered call that needs the leader).
    pub serving_ms: f64,
}

/// Writes `entries` journal entries through `addr` (anonymous
/// GetOrCreateJob calls, one new job each) from 32 callers.
async fn fill(addr: &str, dataset_id: &str, entries: usize) -> anyhow::Result<()> {
    let c = DispatcherServiceClient::new(wire::channel(addr).await);
    let callers = 32;
    let mut tasks = Vec::new();
    for k in 0..callers {
        let mut c = c.clone();
        let dataset_id = dataset_id.to_string();
        let n = entries / callers + usize::from(k < entries % callers);
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                c.get_or_create_job(GetOrCreateJobRequest {
                    dataset_id: dataset_id.clone(),
                    processing_mode_def: Some(ProcessingModeDef { sharding_policy: 0 }),
                    ..Default::default()
                })
                .await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn register_off(addr: &str, def: &[u8]) -> anyhow::Result<String> {
    let mut c = DispatcherServiceClient::new(wire::channel(addr).await);
    Ok(c.get_or_register_dataset(GetOrRegisterDatasetRequest {
        dataset: def.to_vec().into(),
        metadata: b"\x10\x01".to_vec().into(),
        optional_dataset_id: None,
    })
    .await?
    .into_inner()
    .dataset_id)
}

/// Restart with `entries` of history: TF's fault-tolerant dispatcher and a
/// coordstore node.
pub async fn restart(entries: usize) -> anyhow::Result<Vec<RestartRow>> {
    let mut rows = Vec::new();
    let work = tempfile::tempdir()?;
    let (tf, addr, def) = tf_dispatcher(Some(work.path()))?;
    let ds = register_off(&addr, &def).await?;
    fill(&addr, &ds, entries).await?;
    drop(tf);
    let port = addr.rsplit(':').next().unwrap_or_default().to_string();
    let args = vec![
        "--port".to_string(),
        port,
        "--work-dir".to_string(),
        work.path().display().to_string(),
    ];
    let mut again = PyProc::spawn_with(
        &tf_python(),
        "tfdata_dispatcher.py",
        &args,
        &std::env::temp_dir(),
        &[],
    );
    again.wait_line("READY", Duration::from_secs(300));
    let seconds: f64 = again
        .lines()
        .iter()
        .find_map(|l| l.strip_prefix("STARTED ").map(str::to_string))
        .ok_or_else(|| anyhow::anyhow!("no STARTED line"))?
        .parse()?;
    rows.push(RestartRow {
        peer: "TF 2.21 dispatcher, fault tolerant".into(),
        entries,
        serving_ms: seconds * 1000.0,
    });
    drop(again);

    let mut cluster = Cluster::start(1, &[]);
    cluster.wait_leader(&[0], Duration::from_secs(60)).await;
    let addr = cluster.nodes[0].addr.clone();
    let ds = register_off(&addr, &def).await?;
    fill(&addr, &ds, entries).await?;
    cluster.kill(0);
    let started = Instant::now();
    cluster.restart(0);
    // Serving: a call that needs the leader and the replayed state answers.
    let probe = GetDataServiceMetadataRequest { dataset_id: ds };
    loop {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_millis(200))
            .connect()
            .await;
        if let Ok(ch) = ch {
            if DispatcherServiceClient::new(ch)
                .get_data_service_metadata(probe.clone())
                .await
                .is_ok()
            {
                break;
            }
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(120), "not serving");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rows.push(RestartRow {
        peer: "coordstore 1 node".into(),
        entries,
        serving_ms: started.elapsed().as_secs_f64() * 1000.0,
    });
    Ok(rows)
}

/// How long a reading client stalls when the dispatcher dies near the end
/// of an epoch, over several runs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StallRow {
    /// Peer name.
    pub peer: String,
    /// The longest wait for an element in any run, s.
    pub max_gap_s: f64,
    /// From the last element to the epoch's end, s, one per run.
    pub end_s: Vec<f64>,
}

impl StallRow {
    /// The median run's wait for the epoch's end.
    pub fn end_p50(&self) -> f64 {
        let mut v = self.end_s.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    }

    /// The worst run's wait for the epoch's end.
    pub fn end_max(&self) -> f64 {
        self.end_s.iter().copied().fold(f64::NAN, f64::max)
    }
}

fn worker_proc(dispatcher: &str) -> PyProc {
    let args: Vec<String> = ["worker", "--dispatcher", dispatcher]
        .iter()
        .map(|s| s.to_string())
        .collect();
    PyProc::spawn_with(
        &tf_python(),
        "tfdata_job.py",
        &args,
        &std::env::temp_dir(),
        &[],
    )
}

/// Something to run once the client printed a line: (the line, the action).
type AtLine<'a> = Option<(&'a str, Box<dyn FnOnce() + 'a>)>;

/// Two workers and a client running `scenario` over range(`n`) on
/// `dispatcher`; `at_line` runs once the client printed `line` (if any).
/// The detail of the client's `check` line, whose fields are read as f64.
fn client_run(
    dispatcher: &str,
    scenario: &str,
    n: u32,
    at_line: AtLine<'_>,
    check: &str,
    fields: [&str; 2],
) -> anyhow::Result<(f64, f64)> {
    let mut workers = [worker_proc(dispatcher), worker_proc(dispatcher)];
    for w in &mut workers {
        w.wait_line("READY", Duration::from_secs(120));
    }
    let n = n.to_string();
    let args: Vec<String> = [
        "client",
        "--dispatcher",
        dispatcher,
        "--scenario",
        scenario,
        "--workers",
        "2",
        "--n",
        &n,
        "--deadline",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut client = PyProc::spawn_with(
        &tf_python(),
        "tfdata_job.py",
        &args,
        &std::env::temp_dir(),
        &[],
    );
    if let Some((line, run)) = at_line {
        client.wait_line(line, Duration::from_secs(120));
        run();
    }
    let status = client.wait_exit(Duration::from_secs(240));
    anyhow::ensure!(
        status.success() && client.failed_checks().is_empty(),
        "the client failed: {}",
        client.report()
    );
    let want = format!("\"check\": \"{check}\"");
    let line = client
        .lines()
        .into_iter()
        .find(|l| l.contains(&want))
        .ok_or_else(|| anyhow::anyhow!("no {check} line"))?;
    let v: serde_json::Value = serde_json::from_str(&line)?;
    let f = |k: &str| v["detail"][k].as_f64().unwrap_or(f64::NAN);
    Ok((f(fields[0]), f(fields[1])))
}

/// Two workers and a slow client on `dispatcher`; `kill` runs when the
/// client is 90% through its epoch. The longest wait for an element and the
/// wait for the epoch's end.
fn stall_of(dispatcher: &str, kill: impl FnOnce()) -> anyhow::Result<(f64, f64)> {
    let kill: Box<dyn FnOnce() + '_> = Box::new(kill);
    client_run(
        dispatcher,
        "slow",
        40,
        Some(("NEAR_END", kill)),
        "stall",
        ["max_gap_s", "end_s"],
    )
}

/// Time from `distribute()` to the first element.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FirstRow {
    /// Peer name.
    pub peer: String,
    /// p50 over ten fresh jobs, s.
    pub p50_s: f64,
    /// The slowest of them, s.
    pub max_s: f64,
}

/// Two workers on `dispatcher` and a client timing ten fresh jobs from
/// `distribute()` to their first element (after one warm-up job): p50 and
/// max, s.
fn first_of(dispatcher: &str) -> anyhow::Result<(f64, f64)> {
    client_run(dispatcher, "first", 10, None, "first", ["p50_s", "max_s"])
}

/// Time to the first element on TF's dispatcher (in memory and fault
/// tolerant) and on coordstore (1 node; 3 nodes, client and workers on the
/// leader and on a follower).
pub async fn first_element() -> anyhow::Result<Vec<FirstRow>> {
    let mut rows = Vec::new();
    let mut push = |peer: &str, (p50_s, max_s): (f64, f64)| {
        rows.push(FirstRow {
            peer: peer.to_string(),
            p50_s,
            max_s,
        })
    };
    let (tf_mem, addr, _) = tf_dispatcher(None)?;
    push("TF 2.21 dispatcher, in memory", first_of(&addr)?);
    drop(tf_mem);
    let work = tempfile::tempdir()?;
    let (tf_ft, addr, _) = tf_dispatcher(Some(work.path()))?;
    push("TF 2.21 dispatcher, fault tolerant", first_of(&addr)?);
    drop(tf_ft);
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader(&[0], Duration::from_secs(60)).await;
    push("coordstore 1 node", first_of(&cluster.nodes[0].addr)?);
    drop(cluster);
    // A fresh cluster for each: the workers of a run stay registered after
    // it (upstream keeps a silent worker's tasks too), and a new job would
    // wait for their tasks.
    for on_leader in [true, false] {
        let cluster = Cluster::start(3, &[]);
        let leader = cluster
            .wait_leader(&[0, 1, 2], Duration::from_secs(60))
            .await;
        let (name, at) = if on_leader {
            ("coordstore 3 nodes (on the leader)", leader)
        } else {
            ("coordstore 3 nodes (on a follower)", (leader + 1) % 3)
        };
        push(name, first_of(&cluster.nodes[at].addr)?);
    }
    Ok(rows)
}

/// The stall across a dispatcher death near an epoch's end: coordstore's
/// leader SIGKILLed (clients and workers on a follower), and TF's
/// fault-tolerant dispatcher SIGKILLed and restarted 2 s later on its work
/// dir (what a process manager does).
pub async fn stall(runs: usize) -> anyhow::Result<Vec<StallRow>> {
    let mut ours = StallRow {
        peer: "coordstore 3 nodes, leader SIGKILLed".into(),
        max_gap_s: 0.0,
        end_s: Vec::new(),
    };
    for _ in 0..runs {
        let mut cluster = Cluster::start(3, &[]);
        let leader = cluster
            .wait_leader(&[0, 1, 2], Duration::from_secs(60))
            .await;
        let follower = cluster.nodes[(leader + 1) % 3].addr.clone();
        let pid = cluster.nodes[leader].pid().unwrap_or_default() as i32;
        let (gap, end) = stall_of(&follower, || {
            // SAFETY: kill(2) on the node process this run started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        })?;
        cluster.kill(leader);
        ours.max_gap_s = ours.max_gap_s.max(gap);
        ours.end_s.push(end);
    }
    let mut tf_row = StallRow {
        peer: "TF 2.21 dispatcher, fault tolerant, SIGKILLed and restarted after 2 s".into(),
        max_gap_s: 0.0,
        end_s: Vec::new(),
    };
    for _ in 0..runs {
        let work = tempfile::tempdir()?;
        let (tf, addr, _) = tf_dispatcher(Some(work.path()))?;
        let tf = std::cell::RefCell::new(Some(tf));
        let port = addr.rsplit(':').next().unwrap_or_default().to_string();
        let restarted = std::cell::RefCell::new(None);
        let (gap, end) = stall_of(&addr, || {
            drop(tf.borrow_mut().take());
            let args = vec![
                "--port".to_string(),
                port.clone(),
                "--work-dir".to_string(),
                work.path().display().to_string(),
            ];
            // Spawned from this thread: a child dies with the thread that
            // started it (PR_SET_PDEATHSIG).
            std::thread::sleep(Duration::from_secs(2));
            *restarted.borrow_mut() = Some(PyProc::spawn_with(
                &tf_python(),
                "tfdata_dispatcher.py",
                &args,
                &std::env::temp_dir(),
                &[],
            ));
        })?;
        drop(restarted.borrow_mut().take());
        tf_row.max_gap_s = tf_row.max_gap_s.max(gap);
        tf_row.end_s.push(end);
    }
    Ok(vec![ours, tf_row])
}

/// Runs every peer.
pub async fn run(iterations: usize, load: &SplitLoad) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let (tf_mem, addr, def) = tf_dispatcher(None)?;
    rows.extend(
        measure(
            "TF 2.21 dispatcher, in memory",
            &addr,
            &def,
            iterations,
            load,
        )
        .await?,
    );
    drop(tf_mem);
    let work = tempfile::tempdir()?;
    let (tf_ft, addr, _) = tf_dispatcher(Some(work.path()))?;
    rows.extend(
        measure(
            "TF 2.21 dispatcher, fault tolerant",
            &addr,
            &def,
            iterations,
            load,
        )
        .await?,
    );
    drop(tf_ft);
    for nodes in [1usize, 3] {
        let cluster = Cluster::start(nodes, &[]);
        let all: Vec<usize> = (0..nodes).collect();
        let leader = cluster.wait_leader(&all, Duration::from_secs(60)).await;
        let name = if nodes == 1 {
            "coordstore 1 node".to_string()
        } else {
            "coordstore 3 nodes (client on leader)".to_string()
        };
        rows.extend(measure(&name, &cluster.nodes[leader].addr, &def, iterations, load).await?);
        if nodes == 3 {
            let follower = &cluster.nodes[(leader + 1) % 3].addr;
            rows.extend(
                measure(
                    "coordstore 3 nodes (client on follower)",
                    follower,
                    &def,
                    iterations,
                    load,
                )
                .await?,
            );
        }
    }
    Ok(rows)
}

/// A markdown table: p50 / p99 in ms per call and peer, and each peer's
/// p50 as a multiple of TF's fault-tolerant dispatcher's; then the splits
/// per second by callers, each also as a multiple of TF's fault-tolerant
/// dispatcher's at the same count.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from("| peer |");
    for call in CALLS {
        s.push_str(&format!(" {call} p50 / p99 ms |"));
    }
    s.push_str(" p50 vs TF fault tolerant |\n|---|");
    s.push_str(&"---|".repeat(CALLS.len() + 1));
    s.push('\n');
    let p50 = |peer: &str, call: &str| {
        rows.iter()
            .find(|r| r.peer == peer && r.call == call)
            .map_or(f64::NAN, |r| r.latency.p50_ms)
    };
    let mut peers: Vec<&str> = Vec::new();
    for r in rows {
        if !peers.contains(&r.peer.as_str()) {
            peers.push(&r.peer);
        }
    }
    for peer in &peers {
        s.push_str(&format!("| {peer} |"));
        let mut ratios = Vec::new();
        for call in CALLS {
            let r = rows.iter().find(|r| r.peer == *peer && r.call == call);
            match r {
                Some(r) => s.push_str(&format!(
                    " {:.3} / {:.3} |",
                    r.latency.p50_ms, r.latency.p99_ms
                )),
                None => s.push_str(" – |"),
            }
            ratios.push(format!("{:.2}×", p50(peer, call) / p50(TF_FT, call)));
        }
        s.push_str(&format!(" {} |\n", ratios.join(" / ")));
    }
    s.push_str(&splits_table(rows, &peers));
    s
}

/// TF's fault-tolerant dispatcher, what the tables compare with.
const TF_FT: &str = "TF 2.21 dispatcher, fault tolerant";

/// The markdown table of the splits per second of `peers` by callers, each
/// also as a multiple of TF's fault-tolerant dispatcher's at the same count
/// (empty without split rates).
fn splits_table(rows: &[Row], peers: &[&str]) -> String {
    let rates = |peer: &str| -> Vec<(usize, f64)> {
        rows.iter()
            .find(|r| r.peer == peer && r.call == "GetSplit")
            .map_or_else(Vec::new, |r| r.splits_per_s.clone())
    };
    let callers: Vec<usize> = rates(peers.first().copied().unwrap_or(TF_FT))
        .iter()
        .map(|(c, _)| *c)
        .collect();
    if callers.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n| GetSplit, callers pulling at once |");
    for c in &callers {
        s.push_str(&format!(" {c}: splits/s (vs TF FT) |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(callers.len()));
    s.push('\n');
    let ft = rates(TF_FT);
    for peer in peers {
        s.push_str(&format!("| {peer} |"));
        let mine = rates(peer);
        for c in &callers {
            let rate = mine.iter().find(|(n, _)| n == c).map(|(_, r)| *r);
            let base = ft.iter().find(|(n, _)| n == c).map(|(_, r)| *r);
            match (rate, base) {
                (Some(r), Some(b)) => s.push_str(&format!(" {r:.0} ({:.2}×) |", r / b)),
                (Some(r), None) => s.push_str(&format!(" {r:.0} |")),
                _ => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    s
}
