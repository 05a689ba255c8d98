//! The `xla.coordination` dialect over real gRPC against real `coordstore`
//! processes, driven by a tonic client generated from jaxlib 0.12's proto
//! (`proto/proto/xla_coordination.proto`):
//! codes, messages and payload trailers; bad input; leader failover while
//! calls wait on a follower.

use std::time::Duration;

use coordstore_tests::wait::eventually;
use coordstore_tests::wire::{self, barrier_error, coordination_error, inc, payloads};
use coordstore_tests::Cluster;
use proto::payload_keys;
use proto::xla::*;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(60);

type Client = coordination_service_client::CoordinationServiceClient<tonic::transport::Channel>;

/// Registers tasks 0..n concurrently (the registration barrier needs all);
/// returns the service incarnation.
async fn register_all(addr: &str, n: i32) -> u64 {
    let mut handles = Vec::new();
    for t in 0..n {
        let addr = addr.to_string();
        handles.push(tokio::spawn(async move {
            let mut c = wire::xla(&addr).await;
            c.register_task(RegisterTaskRequest {
                incarnation: 1000 + t as u64,
                source_task_id: t,
            })
            .await
            .expect("register")
            .into_inner()
            .service_incarnation
        }));
    }
    let mut incs = Vec::new();
    for h in handles {
        incs.push(h.await.unwrap());
    }
    assert!(incs.windows(2).all(|w| w[0] == w[1]), "{incs:?}");
    incs[0]
}

async fn insert(
    c: &mut Client,
    si: u64,
    key: &str,
    value: &[u8],
    overwrite: bool,
) -> Result<(), tonic::Status> {
    c.insert_key_value(InsertKeyValueRequest {
        incarnations: inc(0, si),
        kv: Some(KeyValueEntry {
            key: key.into(),
            value: value.to_vec().into(),
        }),
        allow_overwrite: overwrite,
    })
    .await
    .map(|_| ())
}

fn barrier_req(
    si: u64,
    id: &str,
    task: i32,
    tasks: &[i32],
    timeout_ms: i64,
    counter: i64,
) -> BarrierRequest {
    BarrierRequest {
        incarnations: inc(task, si),
        barrier_id: id.into(),
        barrier_timeout_in_ms: timeout_ms,
        task_ids: tasks.to_vec(),
        source_task_id: task,
        counter,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_barriers_and_errors_on_one_node() {
    let cluster = Cluster::start(1, &["--tasks", "2", "--max-message-bytes", "2000000"]);
    let addr = cluster.nodes[0].addr.clone();
    let si = register_all(&addr, 2).await;
    let mut c = wire::xla(&addr).await;

    // KV: normalised keys, ALREADY_EXISTS without payload, NOT_FOUND with it.
    insert(&mut c, si, "//a//b/", b"1", false).await.unwrap();
    let e = insert(&mut c, si, "a/b", b"2", false).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    assert_eq!(e.message(), "key a/b already exists.");
    assert!(payloads(&e).is_empty());
    insert(&mut c, si, "a/b", b"2", true).await.unwrap();
    let got = c
        .get_key_value(GetKeyValueRequest {
            incarnations: inc(0, si),
            key: "/a/b".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .kv
        .unwrap();
    assert_eq!((got.key.as_str(), got.value.as_ref()), ("/a/b", &b"2"[..]));
    let e = c
        .try_get_key_value(TryGetKeyValueRequest {
            incarnations: inc(0, si),
            key: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "Config key nope not found.");
    assert!(coordination_error(&e).is_some());
    let v = c
        .increment_key_value(IncrementKeyValueRequest {
            incarnations: inc(0, si),
            key: "n".into(),
            increment: 5,
        })
        .await
        .unwrap()
        .into_inner()
        .kv
        .unwrap();
    assert_eq!(v.value.as_ref(), b"5");
    let e = c
        .increment_key_value(IncrementKeyValueRequest {
            incarnations: inc(0, si),
            key: "a/b".into(),
            increment: i64::MAX,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    insert(&mut c, si, "a/c", b"3", false).await.unwrap();
    let dir = c
        .get_key_value_dir(GetKeyValueDirRequest {
            incarnations: inc(0, si),
            directory_key: "a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let keys: Vec<_> = dir.kv.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["a/b", "a/c"]);
    c.delete_key_value(DeleteKeyValueRequest {
        incarnations: inc(0, si),
        key: "a".into(),
        is_directory: true,
    })
    .await
    .unwrap();
    let dir = c
        .get_key_value_dir(GetKeyValueDirRequest {
            incarnations: inc(0, si),
            directory_key: "a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(dir.kv.is_empty());

    // A 2-task barrier passes with its counter; the next instance is counter 1.
    for counter in [0, 1] {
        let mut c1 = wire::xla(&addr).await;
        let other = tokio::spawn(async move {
            c1.barrier(barrier_req(si, "b", 1, &[], 10_000, counter))
                .await
        });
        let mine = c
            .barrier(barrier_req(si, "b", 0, &[], 10_000, counter))
            .await
            .unwrap();
        assert_eq!(mine.into_inner().counter, counter);
        assert_eq!(other.await.unwrap().unwrap().into_inner().counter, counter);
    }
    // A barrier only task 0 reaches times out (leader timer) with BarrierError.
    let started = std::time::Instant::now();
    let e = c
        .barrier(barrier_req(si, "late", 0, &[], 300, 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(
        e.message().contains("Barrier timed out. Id: late::0."),
        "{}",
        e.message()
    );
    assert!(e
        .message()
        .contains("# of tasks that reached the barrier: 1/2."));
    let b = barrier_error(&e).expect("BarrierError payload");
    assert_eq!((b.barrier_id.as_str(), b.counter), ("late", 0));
    assert!(started.elapsed() < Duration::from_secs(5));

    // Wrong service incarnation: INTERNAL + ServiceMismatchError.
    let e = insert(&mut c, si.wrapping_add(1), "x", b"", false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal);
    assert_eq!(
        e.message(),
        format!(
            "wrong service incarnation: requested {}, currently {si}",
            si.wrapping_add(1)
        )
    );
    let p = payloads(&e);
    let mismatch = ServiceMismatchError::decode_from(&p[payload_keys::SERVICE_MISMATCH_ERROR]);
    assert_eq!(mismatch.service_incarnation, si);

    // Unknown task: INVALID_ARGUMENT with the coordination payload.
    let e = c
        .register_task(RegisterTaskRequest {
            incarnation: 1,
            source_task_id: 7,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "Unexpected task registered with task=7");
    assert!(coordination_error(&e).is_some());

    // Heartbeat with the wrong incarnation aborts and sets the task to ERROR...
    // (kept for last: it propagates an error.) First a good heartbeat.
    let hb = c
        .heartbeat(HeartbeatRequest {
            incarnations: inc(0, si),
            incarnation: 1000,
            source_task_id: 0,
        })
        .await
        .unwrap();
    assert_eq!(hb.into_inner().service_incarnation, si);

    // WatchTasks: a version from the future answers at once.
    let w = c
        .watch_tasks(WatchTasksRequest {
            incarnations: inc(0, si),
            version_number: i64::MAX,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.task_state.len(), 2);
    assert!(w
        .task_state
        .iter()
        .all(|t| t.state == TaskState::Connected as i32));

    // Oversized message: rejected, the node keeps serving.
    let big = vec![0u8; 3_000_000];
    let e = insert(&mut c, si, "big", &big, false).await.unwrap_err();
    assert!(
        matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{e:?}"
    );
    insert(&mut c, si, "small", b"ok", false).await.unwrap();

    // Reported error reaches a poller with is_reported_error and the source.
    let parked = coordstore_tests::parked_calls(&addr).await;
    let mut poller = wire::xla(&addr).await;
    let poll = tokio::spawn(async move {
        poller
            .poll_for_error(PollForErrorRequest {
                incarnations: inc(0, si),
                source_task_id: 0,
            })
            .await
    });
    coordstore_tests::wait_parked(&addr, parked + 1, WAIT).await;
    c.report_error_to_service(ReportErrorToServiceRequest {
        incarnations: inc(1, si),
        source_task_id: 1,
        error_code: Code::Internal as i32,
        error_message: "boom from 1".into(),
    })
    .await
    .unwrap();
    let e = poll.await.unwrap().unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::Internal, "boom from 1"));
    let p = coordination_error(&e).expect("payload");
    assert!(p.is_reported_error);
    assert_eq!(p.source_task_id, 1);
}

trait DecodeFrom: prost::Message + Default {
    fn decode_from(b: &[u8]) -> Self {
        Self::decode(b).expect("payload decodes")
    }
}
impl<T: prost::Message + Default> DecodeFrom for T {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_gzip_requests() {
    let cluster = Cluster::start(1, &["--tasks", "1"]);
    let addr = cluster.nodes[0].addr.clone();
    let si = register_all(&addr, 1).await;
    // gzip-compressed requests are accepted.
    let mut gz = wire::xla(&addr)
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip);
    insert(&mut gz, si, "zipped", &vec![7u8; 100_000], false)
        .await
        .unwrap();
    // Bytes that are no BarrierRequest: a clean INTERNAL decode error.
    let ch = wire::channel(&addr).await;
    let mut raw = tonic::client::Grpc::new(ch);
    raw.ready().await.unwrap();
    let garbage = proto::coordstore::RaftPayload {
        data: vec![0xff; 16].into(),
    };
    let path =
        http::uri::PathAndQuery::from_static("/xla.coordination.CoordinationService/Barrier");
    let r: Result<tonic::Response<BarrierResponse>, _> = raw
        .unary(
            tonic::Request::new(garbage),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await;
    let e = r.unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    // The node still serves.
    let mut c = wire::xla(&addr).await;
    let got = c
        .try_get_key_value(TryGetKeyValueRequest {
            incarnations: inc(0, si),
            key: "zipped".into(),
        })
        .await
        .unwrap();
    assert_eq!(got.into_inner().kv.unwrap().value.len(), 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_timeout_propagates_to_pollers() {
    let cluster = Cluster::start(1, &["--tasks", "2", "--heartbeat-timeout-ms", "1500"]);
    let addr = cluster.nodes[0].addr.clone();
    let si = register_all(&addr, 2).await;
    let mut poller = wire::xla(&addr).await;
    let poll = tokio::spawn(async move {
        poller
            .poll_for_error(PollForErrorRequest {
                incarnations: inc(0, si),
                source_task_id: 0,
            })
            .await
    });
    // Task 0 keeps heartbeating; task 1 has gone silent.
    let mut c = wire::xla(&addr).await;
    eventually("a heartbeat timeout", Duration::from_secs(20), || {
        let finished = poll.is_finished();
        let mut c = c.clone();
        async move {
            if finished {
                return Ok(());
            }
            c.heartbeat(HeartbeatRequest {
                incarnations: inc(0, si),
                incarnation: 1000,
                source_task_id: 0,
            })
            .await
            .unwrap();
            Err("the poll still runs")
        }
    })
    .await;
    let e = poll.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(
        e.message()
            .starts_with("The following tasks are unhealthy (stopped sending heartbeats):\n1\n"),
        "{}",
        e.message()
    );
    // The silent task is in ERROR: its heartbeat is now refused with ABORTED.
    let e = c
        .heartbeat(HeartbeatRequest {
            incarnations: inc(1, si),
            incarnation: 1001,
            source_task_id: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_waiting_on_a_follower_survive_a_leader_kill() {
    let mut cluster = Cluster::start(3, &["--tasks", "2"]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let follower = (leader + 1) % 3;
    let addr = cluster.nodes[follower].addr.clone();
    let si = register_all(&addr, 2).await;

    let mut c0 = wire::xla(&addr).await;
    let barrier =
        tokio::spawn(async move { c0.barrier(barrier_req(si, "ckpt", 0, &[], 60_000, 0)).await });
    let mut c1 = wire::xla(&addr).await;
    let get = tokio::spawn(async move {
        c1.get_key_value(GetKeyValueRequest {
            incarnations: inc(1, si),
            key: "go".into(),
        })
        .await
    });
    coordstore_tests::wait_parked(&addr, 2, WAIT).await;
    cluster.kill(leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    cluster.wait_leader(&others, WAIT).await;

    // Heartbeats keep flowing through the follower.
    let mut c = wire::xla(&addr).await;
    for t in 0..2 {
        c.heartbeat(HeartbeatRequest {
            incarnations: inc(t, si),
            incarnation: 1000 + t as u64,
            source_task_id: t,
        })
        .await
        .expect("heartbeat after failover");
    }
    insert(&mut c, si, "go", b"now", false).await.unwrap();
    let got = get.await.unwrap().expect("blocking get completes");
    assert_eq!(got.into_inner().kv.unwrap().value.as_ref(), b"now");
    let mut c1 = wire::xla(&addr).await;
    let mine = c1
        .barrier(barrier_req(si, "ckpt", 1, &[], 60_000, 0))
        .await
        .unwrap();
    assert_eq!(mine.into_inner().counter, 0);
    let theirs = barrier.await.unwrap().expect("barrier completes");
    assert_eq!(theirs.into_inner().counter, 0);
    // The service incarnation did not change.
    let hb = c
        .heartbeat(HeartbeatRequest {
            incarnations: inc(0, si),
            incarnation: 1000,
            source_task_id: 0,
        })
        .await
        .unwrap();
    assert_eq!(hb.into_inner().service_incarnation, si);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_keys_and_a_wrong_task_incarnation() {
    let cluster = Cluster::start(1, &["--tasks", "2"]);
    let addr = cluster.nodes[0].addr.clone();
    let si = register_all(&addr, 2).await;
    let mut c = wire::xla(&addr).await;

    // The empty key is a key; "///" normalises to it.
    insert(&mut c, si, "", b"empty", false).await.unwrap();
    let e = insert(&mut c, si, "///", b"again", false)
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::AlreadyExists, "key  already exists.")
    );
    let got = c
        .try_get_key_value(TryGetKeyValueRequest {
            incarnations: inc(0, si),
            key: "/".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .kv
        .unwrap();
    assert_eq!((got.key.as_str(), got.value.as_ref()), ("/", &b"empty"[..]));
    // The empty directory lists nothing, even with keys stored.
    let dir = c
        .get_key_value_dir(GetKeyValueDirRequest {
            incarnations: inc(0, si),
            directory_key: "".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(dir.kv.is_empty());
    // Unicode, spaces and a long key round-trip unchanged.
    let long = "k".repeat(10_000);
    for key in ["ключ/ü ñ", "with space/x", long.as_str()] {
        insert(&mut c, si, key, key.as_bytes(), false)
            .await
            .unwrap();
        let v = c
            .try_get_key_value(TryGetKeyValueRequest {
                incarnations: inc(0, si),
                key: key.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .kv
            .unwrap();
        assert_eq!(v.value.as_ref(), key.as_bytes());
    }
    // Deleting a missing key is OK.
    c.delete_key_value(DeleteKeyValueRequest {
        incarnations: inc(0, si),
        key: "never/was".into(),
        is_directory: true,
    })
    .await
    .unwrap();

    // A heartbeat from another incarnation of task 1: ABORTED, task 1 ERROR,
    // and (nobody polling) every task is set to ERROR.
    let e = c
        .heartbeat(HeartbeatRequest {
            incarnations: inc(1, si),
            incarnation: 4242,
            source_task_id: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    assert!(
        e.message()
            .starts_with("1 Heartbeat: Incarnation ID mismatch: expecting 1001 but got 4242."),
        "{}",
        e.message()
    );
    let w = c
        .watch_tasks(WatchTasksRequest {
            incarnations: inc(0, si),
            version_number: -1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        w.task_state
            .iter()
            .all(|t| t.state == TaskState::Error as i32),
        "{w:?}"
    );
    // Registering again with yet another incarnation: ABORTED, with source task.
    let e = c
        .register_task(RegisterTaskRequest {
            incarnation: 7,
            source_task_id: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    assert!(e.message().contains("already in error"), "{}", e.message());
    assert_eq!(coordination_error(&e).map(|p| p.source_task_id), Some(1));
}

/// Bounded fuzzing of every request decoder of both dialects over the wire:
/// random bytes to every method never crash the node, and it keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_to_every_method_never_crash_the_node() {
    let cluster = Cluster::start(1, &["--tasks", "2", "--leader-wait-ms", "2000"]);
    let addr = cluster.nodes[0].addr.clone();
    let ch = wire::channel(&addr).await;
    let methods = [
        "/xla.coordination.CoordinationService/RegisterTask",
        "/xla.coordination.CoordinationService/Heartbeat",
        "/xla.coordination.CoordinationService/ShutdownTask",
        "/xla.coordination.CoordinationService/WatchTasks",
        "/xla.coordination.CoordinationService/InsertKeyValue",
        "/xla.coordination.CoordinationService/TryGetKeyValue",
        "/xla.coordination.CoordinationService/IncrementKeyValue",
        "/xla.coordination.CoordinationService/GetKeyValueDir",
        "/xla.coordination.CoordinationService/DeleteKeyValue",
        "/xla.coordination.CoordinationService/CancelBarrier",
        "/xla.coordination.CoordinationService/ReportErrorToService",
        "/tensorflow.CoordinationService/InsertKeyValue",
        "/tensorflow.CoordinationService/TryGetKeyValue",
        "/tensorflow.CoordinationService/ResetTask",
        "/tensorflow.CoordinationService/ReportErrorToService",
        "/coordstore.v1.Node/Propose",
        "/coordstore.v1.Node/KvGet",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for method in methods {
        for _ in 0..12 {
            let len = (next() % 48) as usize;
            let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let mut raw = tonic::client::Grpc::new(ch.clone());
            raw.ready().await.unwrap();
            let path = http::uri::PathAndQuery::from_static(method);
            let call = raw.unary(
                tonic::Request::new(proto::coordstore::RaftPayload { data: data.into() }),
                path,
                tonic_prost::ProstCodec::<_, proto::coordstore::RaftPayload>::default(),
            );
            // Any answer is fine (most are decode errors); waiting calls
            // (a blocking get, a barrier) are cut short.
            let _ = tokio::time::timeout(Duration::from_millis(500), call).await;
        }
    }
    // Still serving.
    let mut c = wire::xla(&addr).await;
    let e = c
        .register_task(RegisterTaskRequest {
            incarnation: 1,
            source_task_id: 9,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut cluster = cluster;
    assert!(cluster.nodes[0].is_running(), "{}", cluster.logs());
}

/// A malformed exactly-once origin header is refused with INVALID_ARGUMENT
/// and applies nothing; a well-formed one replays the first outcome, and a
/// late copy of a request its client declared done is refused, not applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_headers_bad_replayed_and_late() {
    let cluster = Cluster::start(1, &["--tasks", "1"]);
    let addr = cluster.nodes[0].addr.clone();
    let si = register_all(&addr, 1).await;
    let mut c = wire::xla(&addr).await;
    let incr = |origin: &str| {
        let mut req = tonic::Request::new(IncrementKeyValueRequest {
            incarnations: inc(0, si),
            key: "n".into(),
            increment: 1,
        });
        req.metadata_mut()
            .insert(proto::ORIGIN_HEADER, origin.parse().unwrap());
        req
    };
    for (bad, why) in [
        ("seven", "malformed origin"),
        ("7", "malformed origin"),
        ("7:1:2:3", "malformed origin"),
        ("7:1:2", "declares its own request done"),
    ] {
        let e = c.increment_key_value(incr(bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
        assert!(e.message().contains(why), "{bad}: {e:?}");
    }
    let value = |r: tonic::Response<IncrementKeyValueResponse>| {
        String::from_utf8(r.into_inner().kv.unwrap().value.to_vec()).unwrap()
    };
    assert_eq!(
        value(c.increment_key_value(incr("7:1:1")).await.unwrap()),
        "1"
    );
    // A retry: the first outcome again.
    assert_eq!(
        value(c.increment_key_value(incr("7:1:1")).await.unwrap()),
        "1"
    );
    assert_eq!(
        value(c.increment_key_value(incr("7:2:2")).await.unwrap()),
        "2"
    );
    // Seq 1 was declared done by seq 2: a late copy is refused.
    let e = c.increment_key_value(incr("7:1:1")).await.unwrap_err();
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    assert!(e.message().contains("late copy"), "{e:?}");
    let got = c
        .try_get_key_value(TryGetKeyValueRequest {
            incarnations: inc(0, si),
            key: "n".into(),
        })
        .await
        .unwrap();
    assert_eq!(got.into_inner().kv.unwrap().value.as_ref(), b"2");
}

/// Parked calls are bounded (--max-parked-calls): past the bound a call that
/// would park gets RESOURCE_EXHAUSTED, and nothing else changes; a parked
/// blocking get (woken per key) answers when its key is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_calls_are_bounded_and_blocking_gets_wake_on_their_key() {
    let cluster = Cluster::start(1, &["--tasks", "1", "--max-parked-calls", "2"]);
    let addr = cluster.nodes[0].addr.clone();
    let si = register_all(&addr, 1).await;
    let get = |key: &'static str| {
        let addr = addr.clone();
        tokio::spawn(async move {
            let mut c = wire::xla(&addr).await;
            c.get_key_value(GetKeyValueRequest {
                incarnations: inc(0, si),
                key: key.into(),
            })
            .await
        })
    };
    let a = get("park/a");
    let b = get("park/b");
    coordstore_tests::wait_parked(&addr, 2, WAIT).await;
    let mut c = wire::xla(&addr).await;
    let e = c
        .get_key_value(GetKeyValueRequest {
            incarnations: inc(0, si),
            key: "park/c".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("--max-parked-calls 2"),
        "{}",
        e.message()
    );
    // A present key is answered at once even at the bound.
    insert(&mut c, si, "park/here", b"h", false).await.unwrap();
    let got = c
        .get_key_value(GetKeyValueRequest {
            incarnations: inc(0, si),
            key: "park/here".into(),
        })
        .await
        .unwrap();
    assert_eq!(got.into_inner().kv.unwrap().value.as_ref(), b"h");
    // Writing b answers b's get; a's keeps waiting.
    insert(&mut c, si, "park/b", b"vb", false).await.unwrap();
    let got = b.await.unwrap().unwrap().into_inner();
    assert_eq!(got.kv.unwrap().value.as_ref(), b"vb");
    assert!(!a.is_finished());
    insert(&mut c, si, "park/a", b"va", false).await.unwrap();
    let got = a.await.unwrap().unwrap().into_inner();
    assert_eq!(got.kv.unwrap().value.as_ref(), b"va");
    assert_eq!(coordstore_tests::parked_calls(&addr).await, 0);
}
