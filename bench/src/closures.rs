//! `closures`: the durable closure queue end to end through a 3-node
//! cluster, with the Rust agent's `Coordinator` and `Worker` in this
//! process (each worker on its own connections, as a worker process would
//! be): schedule → result throughput and latency with 1 and 16 workers, and
//! the time from a worker's death (it stops calling: no renewal, its
//! connections closed) to its closure starting on another worker, in leases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::closures::{Coordinator, QueueConfig, WorkError, Worker};
use coordstore_tests::Cluster;

use crate::stats::{summarize, Latency};

/// One workers configuration.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ThroughputRow {
    /// Worker count.
    pub workers: usize,
    /// Closures each worker takes per get.
    pub prefetch: u32,
    /// How the coordinator schedules: `schedule` + `fetch` per closure from
    /// `in_flight` tasks, or `schedule_many` + `fetch_all` of `batch`.
    pub mode: String,
    /// Closures the coordinator keeps in flight (scheduled, result not yet
    /// fetched).
    pub in_flight: usize,
    /// Closures whose result was fetched.
    pub closures: u64,
    /// Closures per second, schedule → fetched result.
    pub per_s: f64,
    /// Schedule start → result fetched, under that load.
    pub latency: Latency,
    /// One closure at a time: schedule start → result fetched.
    pub alone: Latency,
}

/// A worker's death → its closure starting elsewhere.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RerunRow {
    /// The queue's lease, ms.
    pub lease_ms: u64,
    /// Each run's death → re-run start, in leases.
    pub leases: Vec<f64>,
}

/// Everything the suite measured.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ClosuresReport {
    /// Per worker count.
    pub throughput: Vec<ThroughputRow>,
    /// Worker deaths.
    pub rerun: RerunRow,
}

fn spawn_workers(
    nodes: &[String],
    queue: &str,
    n: usize,
    prefetch: u32,
    started: Arc<AtomicU64>,
) -> anyhow::Result<(Vec<tokio::task::JoinHandle<()>>, Arc<tokio::sync::Notify>)> {
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut handles = Vec::new();
    for i in 0..n {
        let worker = Worker::new(nodes, queue, &format!("bench-w{i}"))?;
        let stop = stop.clone();
        let started = started.clone();
        handles.push(tokio::spawn(async move {
            let started = &started;
            let r = worker
                .run_prefetching(
                    prefetch,
                    |c| async move {
                        started.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, WorkError>(c.payload)
                    },
                    stop.notified(),
                )
                .await;
            if let Err(e) = r {
                eprintln!("closures: worker {i}: {e}");
            }
        }));
    }
    Ok((handles, stop))
}

async fn stop_workers(handles: Vec<tokio::task::JoinHandle<()>>, stop: &tokio::sync::Notify) {
    stop.notify_waiters();
    for h in handles {
        h.abort();
        let _ = h.await;
    }
}

/// Schedule → fetch, one closure at a time.
async fn alone(c: &Coordinator, n: usize) -> anyhow::Result<Latency> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t0 = Instant::now();
        let v = c.schedule(format!("alone-{i}").into_bytes()).await?;
        let got = v.fetch().await?;
        anyhow::ensure!(got.as_ref() == format!("alone-{i}").as_bytes());
        if i >= 10 {
            samples.push(t0.elapsed());
        }
    }
    Ok(summarize(&mut samples))
}

/// `in_flight` schedulers, each scheduling and fetching one closure after
/// another, for `seconds`.
async fn load(
    c: &Coordinator,
    in_flight: usize,
    seconds: f64,
) -> anyhow::Result<(u64, f64, Latency)> {
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for s in 0..in_flight {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut i = 0u64;
            while Instant::now() < end {
                let payload = format!("{s}-{i}");
                let t = Instant::now();
                let v = c.schedule(payload.clone().into_bytes()).await?;
                let got = v.fetch().await?;
                anyhow::ensure!(got.as_ref() == payload.as_bytes(), "wrong result");
                samples.push(t.elapsed());
                i += 1;
            }
            Ok::<_, anyhow::Error>(samples)
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await??);
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = samples.len() as u64;
    Ok((n, n as f64 / secs, summarize(&mut samples)))
}

/// `tasks` schedulers, each scheduling `batch` closures in one call and
/// fetching their results in one call, over and over, for `seconds`.
async fn load_batched(
    c: &Coordinator,
    tasks: usize,
    batch: usize,
    seconds: f64,
) -> anyhow::Result<(u64, f64, Latency)> {
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(seconds);
    let mut handles = Vec::new();
    for s in 0..tasks {
        let c = c.clone();
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut round = 0u64;
            while Instant::now() < end {
                let payloads: Vec<Vec<u8>> = (0..batch)
                    .map(|i| format!("{s}-{round}-{i}").into_bytes())
                    .collect();
                let t = Instant::now();
                let values = c.schedule_many(payloads.clone()).await?;
                let got = c.fetch_all(&values).await?;
                let took = t.elapsed();
                anyhow::ensure!(
                    got.iter()
                        .zip(&payloads)
                        .all(|(g, p)| g.as_ref() == p.as_slice()),
                    "wrong result"
                );
                samples.extend(std::iter::repeat_n(took, batch));
                round += 1;
            }
            Ok::<_, anyhow::Error>(samples)
        }));
    }
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(h.await??);
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = samples.len() as u64;
    Ok((n, n as f64 / secs, summarize(&mut samples)))
}

/// Worker deaths: worker A takes a closure and dies (stops calling, its
/// connections close); the time until worker B starts it, in leases.
async fn rerun(nodes: &[String], lease_ms: u64, runs: usize) -> anyhow::Result<RerunRow> {
    let config = QueueConfig {
        lease_ms,
        ..Default::default()
    };
    let c = Coordinator::create(nodes, "bench-rerun", Some(config), "bench").await?;
    let mut leases = Vec::new();
    for r in 0..runs {
        let dead = Worker::new(nodes, "bench-rerun", &format!("dead-{r}"))?;
        let v = c.schedule(format!("rerun-{r}").into_bytes()).await?;
        let (closure, _) = dead
            .get(Duration::from_secs(10))
            .await?
            .ok_or_else(|| anyhow::anyhow!("no closure for the doomed worker"))?;
        anyhow::ensure!(closure.id == v.id());
        // Dies mid-closure, 0, 1/6 or 1/3 of a lease after its last
        // renewal (alive, it renews every third of a lease).
        dead.renew().await?;
        tokio::time::sleep(Duration::from_millis(lease_ms * (r as u64 % 3) / 6)).await;
        drop(dead);
        let died = Instant::now();
        let other = Worker::new(nodes, "bench-rerun", &format!("other-{r}"))?;
        let (again, _) = other
            .get(Duration::from_millis(lease_ms * 10))
            .await?
            .ok_or_else(|| anyhow::anyhow!("the closure never ran again"))?;
        let took = died.elapsed();
        anyhow::ensure!(again.id == v.id() && again.attempt == 2);
        other.finish(again.id, again.payload).await?;
        anyhow::ensure!(v.fetch().await?.as_ref() == format!("rerun-{r}").as_bytes());
        leases.push(took.as_secs_f64() * 1000.0 / lease_ms as f64);
    }
    Ok(RerunRow { lease_ms, leases })
}

/// Tasks scheduling and fetching one closure after another in the
/// per-closure mode.
pub const PER_CLOSURE_TASKS: usize = 64;

/// How the suite loads the queue.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Closures kept in flight in the batched mode.
    pub in_flight: usize,
    /// Closures per `schedule_many` in the batched mode.
    pub batch: usize,
    /// Closures per worker get in the batched mode.
    pub prefetch: u32,
    /// Seconds per configuration.
    pub seconds: f64,
}

/// Runs the suite on a fresh 3-node cluster.
pub async fn run(
    workers: &[usize],
    load_: Load,
    rerun_runs: usize,
) -> anyhow::Result<ClosuresReport> {
    let mut flags = vec![
        "--raft-heartbeat-ms",
        "100",
        "--election-timeout-ms",
        "1000",
    ];
    flags.extend(
        crate::peers::SERVER_FLAGS
            .get()
            .into_iter()
            .flatten()
            .map(String::as_str),
    );
    let cluster = Cluster::start(3, &flags);
    cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(60))
        .await;
    let nodes = cluster.addrs();
    let mut throughput = Vec::new();
    let Load {
        in_flight,
        batch,
        prefetch,
        seconds,
    } = load_;
    for &w in workers {
        for (batched, prefetch) in [(false, 1), (true, 1), (true, prefetch)] {
            let in_flight = if batched {
                in_flight
            } else {
                PER_CLOSURE_TASKS
            };
            let mode = if batched {
                format!("schedule_many({batch}) + fetch_all")
            } else {
                "schedule + fetch".to_string()
            };
            eprintln!("closures: {w} workers (prefetch {prefetch}), {mode}, {in_flight} in flight, {seconds} s");
            let queue = format!("bench-{w}-{batched}-{prefetch}");
            let c = Coordinator::create(&nodes, &queue, None, "bench").await?;
            let started = Arc::new(AtomicU64::new(0));
            let (handles, stop) = spawn_workers(&nodes, &queue, w, prefetch, started.clone())?;
            let alone = alone(&c, 100).await?;
            let (closures, per_s, latency) = if batched {
                let tasks = (in_flight / batch).max(1);
                load_batched(&c, tasks, batch, seconds).await?
            } else {
                load(&c, in_flight, seconds).await?
            };
            c.join().await?;
            stop_workers(handles, &stop).await;
            throughput.push(ThroughputRow {
                workers: w,
                prefetch,
                mode,
                in_flight,
                closures,
                per_s,
                latency,
                alone,
            });
        }
    }
    eprintln!("closures: {rerun_runs} worker deaths");
    let rerun = rerun(&nodes, 1000, rerun_runs).await?;
    Ok(ClosuresReport { throughput, rerun })
}

/// The markdown tables.
pub fn table(r: &ClosuresReport) -> String {
    let mut md = String::from(
        "| closure queue, 3 nodes | workers × prefetch | in flight | closures/s | p50 / p99 under load, ms | p50 alone, ms |\n|---|---|---|---|---|---|\n",
    );
    for t in &r.throughput {
        md.push_str(&format!(
            "| {} | {} × {} | {} | {:.0} | {:.2} / {:.2} | {:.2} |\n",
            t.mode,
            t.workers,
            t.prefetch,
            t.in_flight,
            t.per_s,
            t.latency.p50_ms,
            t.latency.p99_ms,
            t.alone.p50_ms
        ));
    }
    let mut l = r.rerun.leases.clone();
    l.sort_by(f64::total_cmp);
    if let (Some(min), Some(max)) = (l.first(), l.last()) {
        md.push_str(&format!(
            "\n| worker death → closure running elsewhere | lease | runs | min / median / max, leases |\n|---|---|---|---|\n| 3 nodes | {} ms | {} | {:.2} / {:.2} / {:.2} |\n",
            r.rerun.lease_ms,
            l.len(),
            min,
            l[l.len() / 2],
            max
        ));
    }
    md
}
