//! The `tensorflow.CoordinationService` dialect (the seed protocol of
//! `docs/protocols.md`) from a tonic client generated from
//! `proto/proto/tf_coordination.proto`, against a real node: named jobs,
//! WaitForAllTasks device aggregation, barriers without counters, errors and
//! ResetTask.

use std::time::Duration;

use coordstore_tests::wire;
use coordstore_tests::Cluster;
use prost::Message;
use proto::payload_keys;
use proto::tf::coordination_service_device_info::Type as DeviceType;
use proto::tf::*;
use tonic::Code;

fn task(job: &str, id: i32) -> Option<CoordinatedTask> {
    Some(CoordinatedTask {
        job_name: job.into(),
        task_id: id,
        recoverable: false,
    })
}

fn devices(names: &[&str]) -> Option<CoordinationServiceDeviceInfo> {
    Some(CoordinationServiceDeviceInfo {
        r#type: Some(DeviceType::Tf(TfDeviceList {
            devices: names.iter().map(|n| n.as_bytes().to_vec()).collect(),
        })),
    })
}

const TASKS: [(&str, i32); 3] = [("worker", 0), ("worker", 1), ("ps", 0)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_jobs_device_info_barriers_and_reset() {
    let cluster = Cluster::start(
        1,
        &[
            "--job",
            "worker=2",
            "--job",
            "ps=1",
            "--shutdown-timeout-ms",
            "0",
        ],
    );
    let addr = cluster.nodes[0].addr.clone();

    // Every task registers, then waits for all with its own devices.
    let mut handles = Vec::new();
    for (i, (job, id)) in TASKS.into_iter().enumerate() {
        let addr = addr.clone();
        handles.push(tokio::spawn(async move {
            let mut c = wire::tf(&addr).await;
            let inc = c
                .register_task(RegisterTaskRequest {
                    incarnation: 50 + i as u64,
                    source_task: task(job, id),
                })
                .await
                .expect("register")
                .into_inner()
                .leader_incarnation;
            let dev = format!("/job:{job}/task:{id}/device:CPU:0");
            let all = c
                .wait_for_all_tasks(WaitForAllTasksRequest {
                    local_device_info: devices(&[&dev]),
                    source_task: task(job, id),
                    device_info: None,
                })
                .await
                .expect("wait for all")
                .into_inner();
            (inc, all)
        }));
    }
    let mut incs = Vec::new();
    for h in handles {
        let (inc, all) = h.await.unwrap();
        incs.push(inc);
        assert_eq!(all.leader_incarnation, inc);
        let Some(DeviceType::Tf(list)) = all.cluster_device_info.unwrap().r#type else {
            panic!("tf device list expected");
        };
        let names: Vec<String> = list
            .devices
            .iter()
            .map(|d| String::from_utf8(d.clone()).unwrap())
            .collect();
        // Aggregated by job name, then task id.
        assert_eq!(
            names,
            [
                "/job:ps/task:0/device:CPU:0",
                "/job:worker/task:0/device:CPU:0",
                "/job:worker/task:1/device:CPU:0"
            ]
        );
    }
    assert!(incs.windows(2).all(|w| w[0] == w[1]));

    let mut c = wire::tf(&addr).await;
    // KV without overwrite.
    c.insert_key_value(InsertKeyValueRequest {
        kv: Some(KeyValueEntry {
            key: "cfg/lr".into(),
            value: "0.1".into(),
        }),
        allow_overwrite: false,
    })
    .await
    .unwrap();
    let e = c
        .insert_key_value(InsertKeyValueRequest {
            kv: Some(KeyValueEntry {
                key: "cfg/lr".into(),
                value: "0.2".into(),
            }),
            allow_overwrite: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    let v = c
        .get_key_value(GetKeyValueRequest {
            key: "cfg/lr".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .kv
        .unwrap();
    assert_eq!(v.value.as_ref(), b"0.1");

    // A barrier over the two workers; once passed it replays immediately.
    let workers = vec![task("worker", 0).unwrap(), task("worker", 1).unwrap()];
    for _ in 0..2 {
        let mut c1 = wire::tf(&addr).await;
        let ws = workers.clone();
        let other = tokio::spawn(async move {
            c1.barrier(BarrierRequest {
                barrier_id: "sync".into(),
                barrier_timeout_in_ms: 10_000,
                tasks: ws,
                source_task: task("worker", 1),
                counter: 0,
            })
            .await
        });
        c.barrier(BarrierRequest {
            barrier_id: "sync".into(),
            barrier_timeout_in_ms: 10_000,
            tasks: workers.clone(),
            source_task: task("worker", 0),
            counter: 0,
        })
        .await
        .unwrap();
        other.await.unwrap().unwrap();
    }
    // The ps is not a participant.
    let e = c
        .barrier(BarrierRequest {
            barrier_id: "other".into(),
            barrier_timeout_in_ms: 10_000,
            tasks: workers.clone(),
            source_task: task("ps", 0),
            counter: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e
        .message()
        .contains("A non-participating task (/job:ps/replica:0/task:0)"));

    // An unknown job is refused with the coordination payload.
    let e = c
        .register_task(RegisterTaskRequest {
            incarnation: 1,
            source_task: task("chief", 0),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("/job:chief/replica:0/task:0"));

    // A reported error sets the task to ERROR; heartbeats then fail with the
    // source task in the payload; ResetTask lets it register again.
    c.report_error_to_service(ReportErrorToServiceRequest {
        error_code: Code::Internal as i32,
        error_message: "worker 1 failed".into(),
        error_origin: task("worker", 1),
    })
    .await
    .unwrap();
    let e = c
        .heartbeat(HeartbeatRequest {
            incarnation: 51,
            source_task: task("worker", 1),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    let payload = wire::payloads(&e);
    let p = CoordinationServiceError::decode(
        payload[payload_keys::COORDINATION_SERVICE_ERROR].as_slice(),
    )
    .unwrap();
    assert!(!p.is_reported_error);
    c.reset_task(ResetTaskRequest {
        source_task: task("worker", 1),
    })
    .await
    .unwrap();
    let again = tokio::time::timeout(
        Duration::from_secs(10),
        c.register_task(RegisterTaskRequest {
            incarnation: 99,
            source_task: task("worker", 1),
        }),
    )
    .await
    .expect("no wait: the registration barrier has passed")
    .unwrap();
    assert_eq!(again.into_inner().leader_incarnation, incs[0]);
    // ReportErrorToTask is the agents' RPC.
    let e = c
        .report_error_to_task(ReportErrorToTaskRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
}

/// TF 2.21's WaitForAllTasks (device lists in request field 6, reply field
/// 4) through a follower of three: every task's reply lists every task's
/// devices in task order, the last caller's too (its own entry must be
/// applied on the follower before it is answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tf_2_21_device_lists_through_a_follower() {
    let cluster = Cluster::start(3, &["--job", "worker=2"]);
    let leader = cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(60))
        .await;
    let addr = cluster.nodes[(leader + 1) % 3].addr.clone();
    let mut handles = Vec::new();
    for id in 0..2 {
        let addr = addr.clone();
        handles.push(tokio::spawn(async move {
            let mut c = wire::tf(&addr).await;
            c.register_task(RegisterTaskRequest {
                incarnation: 70 + id as u64,
                source_task: task("worker", id),
            })
            .await
            .expect("register");
            c.wait_for_all_tasks(WaitForAllTasksRequest {
                local_device_info: None,
                source_task: task("worker", id),
                device_info: Some(DeviceInfo {
                    device: vec![format!("any-of-worker-{id}").into_bytes()],
                }),
            })
            .await
            .expect("wait for all")
            .into_inner()
        }));
    }
    for h in handles {
        let reply = h.await.unwrap();
        let got: Vec<String> = reply
            .device_info
            .expect("field 4")
            .device
            .into_iter()
            .map(|d| String::from_utf8(d).unwrap())
            .collect();
        assert_eq!(got, ["any-of-worker-0", "any-of-worker-1"]);
    }
}
