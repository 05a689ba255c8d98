//! The Rust agent against real nodes: its state machine and error codes,
//! the KV and barrier API, error propagation to the error callback, riding
//! through a leader kill (watch without gaps or repeats), and the preemption
//! sync protocol (agreement, and no hang when a task fails midway).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use agent::preemption::{ManualNotifier, PreemptionSyncManager, ProtocolStatus};
use agent::{Agent, AgentConfig, AgentState, CoordinatedTask};
use bytes::Bytes;
use coordstore_tests::wait::{eventually, holds};
use coordstore_tests::Cluster;
use proto::tf::coordination_service_device_info::Type as DeviceType;
use proto::tf::{CoordinationServiceDeviceInfo, TfDeviceList};
use tonic::{Code, Status};

const WAIT: Duration = Duration::from_secs(60);

type Errors = Arc<Mutex<Vec<Status>>>;
/// Watch deliveries in order: key and value (None = deleted).
type Seen = Arc<Mutex<Vec<(String, Option<Bytes>)>>>;

fn agent(cluster: &Cluster, job: &str, task: i32) -> (Agent, Errors) {
    let endpoints = cluster.nodes.iter().map(|n| n.addr.clone()).collect();
    let mut cfg = AgentConfig::new(endpoints, job, task);
    cfg.heartbeat_interval = Duration::from_millis(500);
    let errors: Errors = Arc::default();
    let sink = errors.clone();
    let a = Agent::new(
        cfg,
        Arc::new(move |e: &Status| sink.lock().unwrap().push(e.clone())),
    )
    .unwrap();
    (a, errors)
}

fn task(job: &str, id: i32) -> CoordinatedTask {
    CoordinatedTask {
        job_name: job.into(),
        task_id: id,
        recoverable: false,
    }
}

async fn connect_all(agents: &[Agent]) {
    let joins: Vec<_> = agents
        .iter()
        .map(|a| {
            let a = a.clone();
            tokio::spawn(async move { a.connect().await })
        })
        .collect();
    for j in joins {
        j.await.unwrap().expect("connect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_machine_kv_barriers_and_error_propagation() {
    let cluster = Cluster::start(1, &["--job", "worker=2", "--shutdown-timeout-ms", "0"]);
    // UNINITIALIZED: every call is FAILED_PRECONDITION.
    let none = Agent::uninitialized();
    assert_eq!(none.state(), AgentState::Uninitialized);
    assert_eq!(
        none.connect().await.unwrap_err().code(),
        Code::FailedPrecondition
    );

    let (a0, errors0) = agent(&cluster, "worker", 0);
    let (a1, _errors1) = agent(&cluster, "worker", 1);
    assert_eq!(a0.state(), AgentState::Disconnected);
    // Barriers need a connection.
    let e = a0.wait_at_barrier("b", WAIT, &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    connect_all(&[a0.clone(), a1.clone()]).await;
    assert_eq!(a0.state(), AgentState::Connected);
    assert_eq!(
        a0.connect().await.unwrap_err().code(),
        Code::FailedPrecondition
    );

    // Device info of every task comes back aggregated.
    let devices = |name: &str| CoordinationServiceDeviceInfo {
        r#type: Some(DeviceType::Tf(TfDeviceList {
            devices: vec![name.as_bytes().to_vec()],
        })),
    };
    let w1 = {
        let a1 = a1.clone();
        tokio::spawn(async move { a1.wait_for_all_tasks(devices("gpu1")).await })
    };
    a0.wait_for_all_tasks(devices("gpu0")).await.unwrap();
    w1.await.unwrap().unwrap();
    let Some(DeviceType::Tf(list)) = a0.cluster_device_info().r#type else {
        panic!("tf devices expected");
    };
    assert_eq!(list.devices, vec![b"gpu0".to_vec(), b"gpu1".to_vec()]);

    // KV: insert / update / get / try / dir / delete.
    a0.insert_key_value("cfg/a", "1").await.unwrap();
    let e = a0.insert_key_value("cfg/a", "2").await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    a0.update_key_value("cfg/a", "2").await.unwrap();
    assert_eq!(a1.get_key_value("cfg/a").await.unwrap(), Bytes::from("2"));
    let e = a1.try_get_key_value("cfg/none").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    a1.insert_key_value("cfg/b", "3").await.unwrap();
    let dir = a0.get_key_value_dir("cfg").await.unwrap();
    assert_eq!(dir.len(), 2);
    let e = a0
        .get_key_value_timeout("never", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    let pending = a0.get_key_value_async("later");
    pending.cancel();
    assert_eq!(pending.wait().await.unwrap_err().code(), Code::Cancelled);
    let pending = a0.get_key_value_async("later");
    a1.insert_key_value("later", "x").await.unwrap();
    assert_eq!(pending.wait().await.unwrap(), Bytes::from("x"));
    a0.delete_key_value("cfg").await.unwrap();
    assert!(a0.get_key_value_dir("cfg").await.unwrap().is_empty());

    // A barrier over both workers, then one cancelled while waited on.
    let b1 = a1.wait_at_barrier_async("sync", WAIT, &[task("worker", 0), task("worker", 1)]);
    a0.wait_at_barrier("sync", WAIT, &[task("worker", 0), task("worker", 1)])
        .await
        .unwrap();
    b1.await.unwrap().unwrap();
    let parked = coordstore_tests::parked_calls(&cluster.nodes[0].addr).await;
    let waiting = a1.wait_at_barrier_async("doomed", WAIT, &[]);
    coordstore_tests::wait_parked(&cluster.nodes[0].addr, parked + 1, WAIT).await;
    a0.cancel_barrier("doomed").await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap_err().code(), Code::Cancelled);

    // Task status of a peer.
    let st = a0.task_status(&task("worker", 1)).await.unwrap();
    assert_eq!(st.state, "CONNECTED");

    // A reported error reaches every task's error callback.
    a1.report_error(Status::internal("worker 1 broke"))
        .await
        .unwrap();
    assert_eq!(a1.state(), AgentState::Error);
    eventually("the propagated error", Duration::from_secs(10), || {
        let got = !errors0.lock().unwrap().is_empty();
        async move { holds(got, || "no error yet") }
    })
    .await;
    let e = errors0.lock().unwrap()[0].clone();
    assert_eq!((e.code(), e.message()), (Code::Internal, "worker 1 broke"));
    assert_eq!(a0.state(), AgentState::Error);
    // Reset only from ERROR; then the task can connect again.
    a1.reset().await.unwrap();
    assert_eq!(a1.state(), AgentState::Disconnected);
    assert_eq!(
        a1.reset().await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    a1.connect().await.unwrap();
    assert_eq!(a1.state(), AgentState::Connected);
    a1.shutdown().await.unwrap();
    assert_eq!(a1.state(), AgentState::Disconnected);
    // An agent in ERROR still shuts down, answering FAILED_PRECONDITION.
    assert_eq!(
        a0.shutdown().await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert_eq!(a0.state(), AgentState::Disconnected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_rides_through_a_leader_kill_and_its_watch_misses_nothing() {
    let mut cluster = Cluster::start(3, &["--job", "worker=1"]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let (a, errors) = agent(&cluster, "worker", 0);
    a.connect().await.unwrap();
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    a.start_watch_key(
        "w",
        Arc::new(move |changes: &BTreeMap<String, Option<Bytes>>| {
            let mut s = sink.lock().unwrap();
            for (k, v) in changes {
                s.push((k.clone(), v.clone()));
            }
        }),
    )
    .await
    .unwrap();
    // start_watch_key returns once the service watches: nothing to wait for.
    for i in 0..300 {
        if i == 100 {
            cluster.kill(leader);
        }
        a.insert_key_value(&format!("w/{i:04}"), format!("v{i}"))
            .await
            .unwrap_or_else(|e| panic!("insert {i}: {e}"));
    }
    a.delete_key_value("w/0000").await.unwrap();
    // A last write marks the end: the watch delivers in revision order, so
    // once it arrives every earlier event (and any repeat of one) has.
    a.insert_key_value("w/zzzz", "end").await.unwrap();
    let end = ("w/zzzz".to_string(), Some(Bytes::from("end")));
    eventually("the watch to deliver the end marker", WAIT, || {
        let (done, events) = {
            let s = seen.lock().unwrap();
            (s.contains(&end), s.len())
        };
        async move { holds(done, || format!("the watch fell behind: {events} events")) }
    })
    .await;
    let mut seen = seen.lock().unwrap().clone();
    assert_eq!(seen.pop(), Some(end), "the end marker comes last");
    assert_eq!(seen.len(), 301, "no event missing or repeated");
    for (i, (k, v)) in seen.iter().take(300).enumerate() {
        assert_eq!(k, &format!("w/{i:04}"));
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_bytes()));
    }
    assert_eq!(seen[300], ("w/0000".to_string(), None));
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
    assert_eq!(a.state(), AgentState::Connected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increments_count_once_across_a_leader_kill() {
    let mut cluster = Cluster::start(3, &["--job", "worker=1"]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let (a, _errors) = agent(&cluster, "worker", 0);
    a.connect().await.unwrap();
    for i in 1..=200i64 {
        if i == 100 {
            cluster.kill(leader);
        }
        let v = a
            .increment_key_value("counter", 1)
            .await
            .unwrap_or_else(|e| panic!("increment {i}: {e}"));
        assert_eq!(v, i, "each increment applied once, in order");
    }
    assert_eq!(a.get_key_value("counter").await.unwrap().as_ref(), b"200");
    a.insert_key_value("text", "x").await.unwrap();
    let e = a.increment_key_value("text", 1).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
}

/// Runs N agents' step loops until each reaches the sync point (or `limit`
/// steps); returns the steps they stopped at.
async fn run_steps(
    managers: Vec<Arc<PreemptionSyncManager>>,
    starts: Vec<i64>,
    limit: i64,
    taken: Arc<std::sync::atomic::AtomicUsize>,
) -> Vec<Option<i64>> {
    let joins: Vec<_> = managers
        .into_iter()
        .zip(starts)
        .map(|(m, start)| {
            let taken = taken.clone();
            tokio::spawn(async move {
                let mut step = start;
                while step < start + limit {
                    if m.reached_sync_point(step).await {
                        return Some(step);
                    }
                    step += 1;
                    taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                None
            })
        })
        .collect();
    let mut out = Vec::new();
    for j in joins {
        out.push(j.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_tasks_agree_on_one_step() {
    let cluster = Cluster::start(1, &["--tasks", "3"]);
    let pairs: Vec<(Agent, Errors)> = (0..3).map(|t| agent(&cluster, "jax_worker", t)).collect();
    let agents: Vec<Agent> = pairs.iter().map(|(a, _)| a.clone()).collect();
    connect_all(&agents).await;
    let notifiers: Vec<ManualNotifier> = (0..3).map(|_| ManualNotifier::default()).collect();
    let managers: Vec<Arc<PreemptionSyncManager>> = agents
        .iter()
        .zip(&notifiers)
        .map(|(a, n)| Arc::new(PreemptionSyncManager::start(a.clone(), n).unwrap()))
        .collect();
    // Tasks run at different step counters; task 1 gets the notice shortly.
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let steps = tokio::spawn(run_steps(
        managers.clone(),
        vec![0, 40, 15],
        2000,
        taken.clone(),
    ));
    // The tasks are stepping (30 steps among them) when the notice comes.
    eventually("the tasks to take 30 steps", WAIT, || async {
        let n = taken.load(std::sync::atomic::Ordering::Relaxed);
        holds(n >= 30, || format!("{n} steps"))
    })
    .await;
    notifiers[1].notify(SystemTime::now() + Duration::from_secs(60));
    let stopped = steps.await.unwrap();
    let point = managers[0].sync_point().expect("a sync point was decided");
    assert_eq!(
        stopped,
        vec![Some(point); 3],
        "every task stops at the same step"
    );
    for m in &managers {
        assert_eq!(m.status(), ProtocolStatus::Synced(point));
    }
    // The fastest task started at 40 and had moved on: max + 1 is past it.
    assert!(point > 40);
    // The counters are where stock JAX tasks would look for them.
    let counters = agents[0]
        .get_key_value_dir("PREEMPTION_CURRENT_COUNTER")
        .await
        .unwrap();
    let keys: Vec<&str> = counters.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "PREEMPTION_CURRENT_COUNTER/job:jax_worker/task:0",
            "PREEMPTION_CURRENT_COUNTER/job:jax_worker/task:1",
            "PREEMPTION_CURRENT_COUNTER/job:jax_worker/task:2"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_failing_midway_cancels_the_barrier_so_nobody_hangs() {
    let cluster = Cluster::start(1, &["--tasks", "3"]);
    let pairs: Vec<(Agent, Errors)> = (0..3).map(|t| agent(&cluster, "jax_worker", t)).collect();
    let agents: Vec<Agent> = pairs.iter().map(|(a, _)| a.clone()).collect();
    connect_all(&agents).await;
    // Task 2 fails before it takes part: it runs no manager, and its failure
    // path cancels the barrier (what the manager does when the protocol
    // fails, e.g. when the task cannot report its counter).
    let notifiers: Vec<ManualNotifier> = (0..2).map(|_| ManualNotifier::default()).collect();
    let managers: Vec<PreemptionSyncManager> = agents[..2]
        .iter()
        .zip(&notifiers)
        .map(|(a, n)| PreemptionSyncManager::start(a.clone(), n).unwrap())
        .collect();
    notifiers[0].notify(SystemTime::now() + Duration::from_secs(60));
    // Both managers are waiting at the barrier.
    coordstore_tests::wait_state(&cluster.nodes[0].addr, WAIT, |s| {
        s.coordination()
            .barrier(agent::preemption::PREEMPTION_BARRIER)
            .is_some_and(|b| {
                b.status() == journal::pb::coordination::BarrierStatus::Pending
                    && b.arrivals.len() == 2
            })
    })
    .await;
    agents[2]
        .cancel_barrier(agent::preemption::PREEMPTION_BARRIER)
        .await
        .unwrap();
    // The others' protocol ends (failed) well before the 3-minute barrier timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for m in &managers {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let why = eventually("the task's protocol to fail", left, || {
            let status = m.status();
            async move {
                match status {
                    ProtocolStatus::Failed(why) => Ok(why),
                    hangs => Err(hangs),
                }
            }
        })
        .await;
        assert!(why.contains("barrier"), "{why}");
        assert_eq!(m.sync_point(), None);
        assert!(!m.reached_sync_point(7).await);
    }
}
