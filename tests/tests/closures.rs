//! The durable closure queue with real processes: a 3-node cluster, worker
//! processes and a coordinator process, SIGKILLed mid-run.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent::closures::{Coordinator, Error, Outcome, QueueConfig, WorkError, Worker};
use coordstore_tests::Cluster;

const LEASE_MS: u64 = 1_000;

/// A helper process, SIGKILLed when dropped.
struct Proc(Child);

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        Proc(
            Command::new(env!("CARGO_BIN_EXE_closure_proc"))
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn closure_proc"),
        )
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    wait: Duration,
    mut cond: impl FnMut() -> F,
) {
    let deadline = Instant::now() + wait;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn runs(logs: &[std::path::PathBuf]) -> BTreeMap<u64, usize> {
    let mut runs = BTreeMap::new();
    for l in logs {
        for line in std::fs::read_to_string(l).unwrap_or_default().lines() {
            if let Ok(id) = line.parse::<u64>() {
                *runs.entry(id).or_default() += 1;
            }
        }
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closures_survive_a_worker_and_the_coordinator_being_killed() {
    let cluster = Cluster::start(3, &[]);
    cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let nodes = cluster.addrs();
    let joined = nodes.join(",");
    let config = QueueConfig {
        lease_ms: LEASE_MS,
        ..Default::default()
    };
    Coordinator::create(&nodes, "q", Some(config), "setup")
        .await
        .expect("create queue");

    // The coordinator process schedules 1000 closures and is killed.
    const N: u64 = 1000;
    let mut coordinator = Proc::spawn(&["schedule", &joined, "q", "coord-a", &N.to_string(), "5"]);
    let mut line = String::new();
    {
        use std::io::BufRead;
        let out = coordinator.0.stdout.take().expect("stdout");
        let mut r = std::io::BufReader::new(out);
        r.read_line(&mut line).expect("coordinator output");
    }
    assert_eq!(line.trim(), format!("scheduled {N}"));
    coordinator.kill();

    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("w{i}.log")))
        .collect();
    let mut workers: Vec<Proc> = (0..3)
        .map(|i| {
            Proc::spawn(&[
                "worker",
                &joined,
                "q",
                &format!("w{i}"),
                logs[i].to_str().unwrap(),
            ])
        })
        .collect();

    // Worker 0 is killed mid-closure, once it has run some.
    wait_until(
        "worker 0 to run 50 closures",
        Duration::from_secs(120),
        || {
            let n = runs(&logs[..1]).len();
            async move { n >= 50 }
        },
    )
    .await;
    workers[0].kill();

    // A new coordinator attaches and collects every result.
    let c = Coordinator::attach(&nodes, "q", "coord-a").await.unwrap();
    c.join().await.expect("join");
    let scheduled = c.scheduled().await.unwrap();
    assert_eq!(
        scheduled.len() as u64,
        N,
        "every scheduled closure is listed"
    );
    for (i, info) in scheduled.iter().enumerate() {
        let got = c.remote_value(info.closure_id).fetch().await.unwrap();
        assert_eq!(got.as_ref(), format!("{i}-5!").as_bytes());
    }
    let runs = runs(&logs);
    assert_eq!(runs.len() as u64, N, "every closure ran");
    let reruns: usize = runs.values().map(|n| n - 1).sum();
    // At least once: only what worker 0 held when it died runs again.
    assert!(reruns <= 2, "{reruns} re-runs: {runs:?}");
    drop(workers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_error_is_raised_once_and_cancels_what_is_queued() {
    let cluster = Cluster::start(3, &[]);
    cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let nodes = cluster.addrs();
    let c = Coordinator::create(&nodes, "e", Some(QueueConfig::default()), "c")
        .await
        .unwrap();
    let ok = c.schedule(b"ok".to_vec()).await.unwrap();
    let bad = c.schedule(b"bad".to_vec()).await.unwrap();
    let after = c.schedule(b"after".to_vec()).await.unwrap();
    let worker = Worker::new(&nodes, "e", "w").unwrap();
    // One closure at a time, in order: "ok", then "bad" fails.
    for _ in 0..2 {
        let (closure, _) = worker.get(Duration::from_secs(5)).await.unwrap().unwrap();
        if closure.payload.as_ref() == b"bad" {
            let e = agent::closures::ClosureError {
                code: 3,
                message: "bad input".into(),
                payload: b"pickled".to_vec().into(),
                closure_id: 0,
            };
            assert!(worker.fail(closure.id, e).await.unwrap());
        } else {
            assert!(worker.finish(closure.id, b"done".to_vec()).await.unwrap());
        }
    }
    match c.join().await {
        Err(Error::Raised(e)) => {
            assert_eq!((e.message.as_str(), e.closure_id), ("bad input", bad.id()));
            assert_eq!(e.payload.as_ref(), b"pickled");
        }
        other => panic!("{other:?}"),
    }
    // Raised once: the next join finds the queue idle.
    c.join().await.unwrap();
    assert!(c.done().await.unwrap());
    assert_eq!(ok.fetch().await.unwrap().as_ref(), b"done");
    assert!(matches!(after.fetch().await, Err(Error::Cancelled(_))));
    assert!(matches!(
        bad.outcome(Duration::ZERO).await.unwrap(),
        Outcome::Failed(_)
    ));
    // A worker loop with put-back: the closure runs again elsewhere.
    let again = c.schedule(b"retry".to_vec()).await.unwrap();
    let (first, _) = worker.get(Duration::from_secs(5)).await.unwrap().unwrap();
    assert!(worker.put_back(first.id).await.unwrap());
    let other = Worker::new(&nodes, "e", "w2").unwrap();
    let stop = tokio::sync::Notify::new();
    let run = other.run(
        |c| async move {
            assert_eq!(c.attempt, 2);
            Ok::<_, WorkError>(c.payload)
        },
        stop.notified(),
    );
    tokio::select! {
        r = run => panic!("the worker loop ended: {r:?}"),
        v = again.fetch() => assert_eq!(v.unwrap().as_ref(), b"retry"),
    }
}
