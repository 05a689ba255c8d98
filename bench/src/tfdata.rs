//! `tfdata`: the tf.data service dispatcher's call latency, coordstore (1
//! node, and 3 nodes with the client on the leader and on a follower) beside
//! TensorFlow 2.21's own dispatcher in memory and with `fault_tolerant_mode`
//! (journaled in a work dir: the durable peer), in one run. The calls are
//! the ones a training job repeats: ClientHeartbeat (every client, every
//! second), GetOrCreateJob of a named job that exists (every client of a
//! shared job), and WorkerHeartbeat of a known worker. Target: within 2× of
//! TF's fault-tolerant dispatcher.

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
}

const CALLS: [&str; 3] = ["ClientHeartbeat", "GetOrCreateJob", "WorkerHeartbeat"];

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
) -> anyhow::Result<Vec<Row>> {
    let mut c: DispatcherServiceClient<Channel> =
        DispatcherServiceClient::new(wire::channel(addr).await);
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
    let mut rows = Vec::new();
    for call in CALLS {
        let mut samples = Vec::with_capacity(iterations);
        for i in 0..iterations + 20 {
            let t = Instant::now();
            match call {
                "ClientHeartbeat" => drop(c.client_heartbeat(heartbeat).await?),
                "GetOrCreateJob" => drop(c.get_or_create_job(job.clone()).await?),
                _ => drop(c.worker_heartbeat(worker.clone()).await?),
            }
            // The first 20 calls warm up.
            if i >= 20 {
                samples.push(t.elapsed());
            }
        }
        rows.push(Row {
            peer: peer.into(),
            call: call.into(),
            latency: summarize(&mut samples),
        });
    }
    Ok(rows)
}

/// Runs every peer.
pub async fn run(iterations: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let (tf_mem, addr, def) = tf_dispatcher(None)?;
    rows.extend(measure("TF 2.21 dispatcher, in memory", &addr, &def, iterations).await?);
    drop(tf_mem);
    let work = tempfile::tempdir()?;
    let (tf_ft, addr, _) = tf_dispatcher(Some(work.path()))?;
    rows.extend(
        measure(
            "TF 2.21 dispatcher, fault tolerant",
            &addr,
            &def,
            iterations,
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
        rows.extend(measure(&name, &cluster.nodes[leader].addr, &def, iterations).await?);
        if nodes == 3 {
            let follower = &cluster.nodes[(leader + 1) % 3].addr;
            rows.extend(
                measure(
                    "coordstore 3 nodes (client on follower)",
                    follower,
                    &def,
                    iterations,
                )
                .await?,
            );
        }
    }
    Ok(rows)
}

/// A markdown table: p50 / p99 in ms per call and peer, and each peer's
/// p50 as a multiple of TF's fault-tolerant dispatcher's.
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
    for peer in peers {
        s.push_str(&format!("| {peer} |"));
        let mut ratios = Vec::new();
        for call in CALLS {
            let r = rows.iter().find(|r| r.peer == peer && r.call == call);
            match r {
                Some(r) => s.push_str(&format!(
                    " {:.3} / {:.3} |",
                    r.latency.p50_ms, r.latency.p99_ms
                )),
                None => s.push_str(" – |"),
            }
            ratios.push(format!(
                "{:.2}×",
                p50(peer, call) / p50("TF 2.21 dispatcher, fault tolerant", call)
            ));
        }
        s.push_str(&format!(" {} |\n", ratios.join(" / ")));
    }
    s
}
