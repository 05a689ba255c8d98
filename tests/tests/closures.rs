//! The durable closure queue with real processes: a 3-node cluster, worker
//! processes and a coordinator process, SIGKILLed mid-run.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent::closures::{Coordinator, Error, Outcome, QueueConfig, WorkError, Worker};
use coordstore_tests::wait::{eventually, eventually_blocking, holds};
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
    eventually(
        "worker 0 to run 50 closures",
        Duration::from_secs(120),
        || {
            let n = runs(&logs[..1]).len();
            async move { holds(n >= 50, || n) }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_when_the_leader_is_killed_under_load() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let nodes = cluster.addrs();
    let joined = nodes.join(",");
    let config = QueueConfig {
        lease_ms: LEASE_MS,
        ..Default::default()
    };
    let c = Coordinator::create(&nodes, "l", Some(config), "coord")
        .await
        .expect("create queue");
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("w{i}.log")))
        .collect();
    // Workers taking two closures per get: a lapsed lease puts back both.
    const PREFETCH: usize = 2;
    let workers: Vec<Proc> = (0..3)
        .map(|i| {
            Proc::spawn(&[
                "worker",
                &joined,
                "l",
                &format!("w{i}"),
                logs[i].to_str().unwrap(),
                &PREFETCH.to_string(),
            ])
        })
        .collect();

    // The coordinator schedules rounds of 40, each once the workers are
    // at most two rounds behind, while the leader is killed.
    const ROUNDS: u64 = 15;
    const PER_ROUND: u64 = 40;
    let rounds = Arc::new(AtomicU64::new(0));
    let scheduler = {
        let c = c.clone();
        let logs = logs.clone();
        let rounds = rounds.clone();
        tokio::spawn(async move {
            let mut values = Vec::new();
            for r in 0..ROUNDS {
                let behind = (r * PER_ROUND).saturating_sub(2 * PER_ROUND);
                // (On a blocking thread: a wait's future is not Send.)
                let ran = logs.clone();
                tokio::task::spawn_blocking(move || {
                    eventually_blocking("the workers to catch up", Duration::from_secs(120), || {
                        let n = runs(&ran).len() as u64;
                        holds(n >= behind, || n)
                    })
                })
                .await
                .expect("the workers caught up");
                let payloads =
                    (0..PER_ROUND).map(|i| format!("{}-2", r * PER_ROUND + i).into_bytes());
                values.extend(c.schedule_many(payloads).await.expect("schedule"));
                rounds.fetch_add(1, Ordering::SeqCst);
            }
            values
        })
    };
    eventually("200 closures to run", Duration::from_secs(120), || {
        let n = runs(&logs).len();
        async move { holds(n >= 200, || n) }
    })
    .await;
    cluster.kill(leader);
    assert!(
        rounds.load(Ordering::SeqCst) < ROUNDS,
        "the leader died after the last round was scheduled"
    );
    let values = scheduler.await.expect("scheduler");
    assert_eq!(values.len() as u64, ROUNDS * PER_ROUND);
    c.join().await.expect("join");

    // Every result, each from its own payload.
    let results = c.fetch_all(&values).await.expect("fetch_all");
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.as_ref(), format!("{i}-2!").as_bytes());
    }
    // Every closure ran; a run needs a hand-out (attempts), so nothing ran
    // after its result was recorded; re-runs are the closures whose lease
    // lapsed in the failover: at most what the workers held.
    let runs = runs(&logs);
    let attempts: BTreeMap<u64, u32> = c
        .scheduled()
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.closure_id, i.attempts))
        .collect();
    assert_eq!(runs.len() as u64, ROUNDS * PER_ROUND, "every closure ran");
    for (id, n) in &runs {
        assert!(
            *n as u32 <= attempts[id],
            "closure {id} ran {n} times in {} hand-outs",
            attempts[id]
        );
    }
    let reruns: usize = runs.values().map(|n| n - 1).sum();
    assert!(reruns <= 3 * PREFETCH, "{reruns} re-runs: {runs:?}");
    eprintln!("re-runs across the leader kill: {reruns}");
    drop(workers);
}

fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> tonic::Code {
    r.map_or_else(|s| s.code(), |_| tonic::Code::Ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_get_the_exact_status_and_change_nothing() {
    use proto::coordstore::closure_queue_client::ClosureQueueClient;
    use proto::coordstore::*;
    use tonic::Code;

    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader(&[0], Duration::from_secs(30)).await;
    let nodes = cluster.addrs();
    let config = QueueConfig {
        max_payload_bytes: 16,
        ..Default::default()
    };
    let c = Coordinator::create(&nodes, "b", Some(config), "t")
        .await
        .unwrap();
    let mut q = ClosureQueueClient::new(coordstore_tests::wire::channel(&nodes[0]).await);
    let put = |queue: &str, more: Vec<Vec<u8>>| PutClosureRequest {
        queue: queue.into(),
        payload: b"ok".to_vec().into(),
        tag: "t".into(),
        more_payloads: more.into_iter().map(Into::into).collect(),
    };
    assert_eq!(code(q.put(put("nope", vec![])).await), Code::NotFound);
    // One closure too large refuses the whole put.
    let r = q
        .put(put("b", vec![b"fine".to_vec(), vec![b'x'; 17]]))
        .await;
    assert_eq!(code(r), Code::InvalidArgument);
    assert!(c.scheduled().await.unwrap().is_empty(), "nothing was put");
    let r = q
        .get(GetClosureRequest {
            queue: "b".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::InvalidArgument, "a nameless worker");
    let fetch = |ids: Vec<u64>| FetchClosuresRequest {
        queue: "b".into(),
        closure_ids: ids,
        timeout_ms: 0,
    };
    let r = q.fetch_many(fetch((1..=10_001).collect())).await;
    assert_eq!(code(r), Code::InvalidArgument, "too many ids");
    let r = q.fetch_many(fetch(vec![12345])).await;
    assert_eq!(code(r), Code::NotFound);

    // A put of three, a get of three, a finish of three with one repeated.
    let values = c
        .schedule_many([b"a".to_vec(), b"b".to_vec(), b"c".to_vec()])
        .await
        .unwrap();
    let ids: Vec<u64> = values.iter().map(|v| v.id()).collect();
    assert_eq!(ids, vec![ids[0], ids[0] + 1, ids[0] + 2]);
    let w = Worker::new(&nodes, "b", "w").unwrap();
    let (got, _) = w.get_many(3, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), ids);
    let accepted = w
        .finish_many(vec![
            (ids[0], b"A".to_vec().into()),
            (ids[1], b"B".to_vec().into()),
            (ids[0], b"again".to_vec().into()),
            (ids[2], b"C".to_vec().into()),
        ])
        .await
        .unwrap();
    assert_eq!(accepted, vec![true, true, false, true]);
    let results = c.fetch_all(&values).await.unwrap();
    assert_eq!(results, vec![&b"A"[..], &b"B"[..], &b"C"[..]]);
}
