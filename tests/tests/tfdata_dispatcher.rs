//! `tensorflow.data.DispatcherService` from a tonic client against real
//! nodes: the exact codes TF 2.21's callers react to (`docs/protocols.md`,
//! Errors that end a pipeline), DYNAMIC jobs refused for a source coordstore
//! cannot split, TaskDefs for workers with static sharding,
//! and UNAVAILABLE, never NOT_FOUND, while no leader is known.

use std::time::Duration;

use coordstore_tests::{wire, Cluster};
use proto::tfdata::dispatcher_service_client::DispatcherServiceClient;
use proto::tfdata::*;
use tonic::transport::Channel;
use tonic::Code;

async fn client(addr: &str) -> DispatcherServiceClient<Channel> {
    DispatcherServiceClient::new(wire::channel(addr).await)
}

async fn register(c: &mut DispatcherServiceClient<Channel>) -> String {
    c.get_or_register_dataset(GetOrRegisterDatasetRequest {
        dataset: b"graph".to_vec().into(),
        metadata: b"\x10\x02".to_vec().into(),
        optional_dataset_id: None,
    })
    .await
    .unwrap()
    .into_inner()
    .dataset_id
}

fn job(dataset_id: &str, sharding_policy: i32) -> GetOrCreateJobRequest {
    GetOrCreateJobRequest {
        dataset_id: dataset_id.into(),
        processing_mode_def: Some(ProcessingModeDef { sharding_policy }),
        optional_job_name: None,
        optional_num_consumers: None,
        use_cross_trainer_cache: false,
        target_workers: 0,
    }
}

fn heartbeat(address: &str, current: &[i64]) -> WorkerHeartbeatRequest {
    WorkerHeartbeatRequest {
        worker_address: address.into(),
        current_tasks: current.to_vec(),
        worker_tags: vec![],
        worker_uid: -1,
        transfer_servers: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_and_errors_as_tf_callers_expect() {
    let cluster = Cluster::start(1, &["--tfdata-version", "7"]);
    // The first leader configures the service (InitService) on its first
    // tick; tf.data calls do not wait for it, so wait here: the count of
    // applied entries below must not see it land.
    coordstore_tests::wait_state(&cluster.nodes[0].addr, Duration::from_secs(60), |s| {
        s.is_initialized()
    })
    .await;
    let mut c = client(&cluster.nodes[0].addr).await;
    let v = c.get_version(GetVersionRequest {}).await.unwrap();
    assert_eq!(v.into_inner().version, 7);
    let cfg = c
        .get_data_service_config(GetDataServiceConfigRequest {})
        .await
        .unwrap();
    assert_eq!(cfg.into_inner().config.unwrap().deployment_mode, 0);

    let e = c
        .get_data_service_metadata(GetDataServiceMetadataRequest {
            dataset_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::NotFound, "Dataset id nope not found")
    );
    let e = c
        .get_or_create_iteration(GetOrCreateIterationRequest {
            job_id: 4242,
            repetition: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::NotFound, "Job with id 4242 not found")
    );
    let e = c
        .client_heartbeat(ClientHeartbeatRequest {
            iteration_client_id: 99,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .release_iteration_client(ReleaseIterationClientRequest {
            iteration_client_id: 99,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c.get_split(GetSplitRequest::default()).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::NotFound, "Iteration id 0 not found")
    );
    let e = c.snapshot(SnapshotRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);

    let ds = register(&mut c).await;
    assert_eq!(ds, "1000");
    let e = c.get_or_create_job(job(&ds, 1)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "DYNAMIC: {}", e.message());
    assert!(e.message().contains("DYNAMIC"), "{}", e.message());
    // The metadata comes back as registered; SNAPPY compression (2) takes
    // the first decision.
    let meta = c
        .get_data_service_metadata(GetDataServiceMetadataRequest {
            dataset_id: ds.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(meta.metadata.as_ref(), b"\x10\x02");
    let decide = |disable| DisableCompressionAtRuntimeRequest {
        dataset_id: ds.clone(),
        disable_compression_at_runtime: disable,
    };
    use disable_compression_at_runtime_response::Decision;
    let first = c
        .disable_compression_at_runtime(decide(true))
        .await
        .unwrap();
    assert_eq!(
        first.into_inner().decision,
        Some(Decision::CompressionDisabledAtRuntime(true))
    );
    let second = c
        .disable_compression_at_runtime(decide(false))
        .await
        .unwrap();
    assert_eq!(
        second.into_inner().decision,
        Some(Decision::CompressionDisabledAtRuntime(true))
    );

    // A named job: created once; asked again it is answered from the state
    // (nothing proposed); other parameters are INVALID_ARGUMENT.
    let mut named = job(&ds, 0);
    named.optional_job_name = Some(get_or_create_job_request::OptionalJobName::JobName(
        "shared".into(),
    ));
    let id = c
        .get_or_create_job(named.clone())
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let applied = coordstore_tests::try_status(&cluster.nodes[0].addr)
        .await
        .unwrap()
        .last_applied;
    for _ in 0..3 {
        let again = c.get_or_create_job(named.clone()).await.unwrap();
        assert_eq!(again.into_inner().job_id, id);
    }
    let after = coordstore_tests::try_status(&cluster.nodes[0].addr)
        .await
        .unwrap()
        .last_applied;
    assert_eq!(after, applied, "an existing named job proposes nothing");
    named.processing_mode_def = Some(ProcessingModeDef { sharding_policy: 3 });
    let e = c.get_or_create_job(named).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());

    // A worker, a job and an iteration: the worker's heartbeat hands it the
    // task, and drops what it runs that is not its own.
    c.worker_heartbeat(heartbeat("w:1", &[])).await.unwrap();
    let job_id = c
        .get_or_create_job(job(&ds, 0))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let client_id = c
        .get_or_create_iteration(GetOrCreateIterationRequest {
            job_id,
            repetition: 1,
        })
        .await
        .unwrap()
        .into_inner()
        .iteration_client_id;
    let hb = c
        .worker_heartbeat(heartbeat("w:1", &[777]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.tasks_to_delete, vec![777]);
    let [task] = &hb.new_tasks[..] else {
        panic!("one new task: {hb:?}");
    };
    assert_eq!(task.worker_address, "w:1");
    assert_eq!(
        task.dataset,
        Some(task_def::Dataset::DatasetDef(b"graph".to_vec().into()))
    );
    let info = c
        .client_heartbeat(ClientHeartbeatRequest {
            iteration_client_id: client_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.task_info.len(), 1);
    assert!(!info.iteration_finished);
    // An unknown task id in WorkerUpdate is ignored, not refused
    // (tensorflow#52252); the known one finishes the iteration.
    c.worker_update(WorkerUpdateRequest {
        worker_address: "w:1".into(),
        updates: vec![
            TaskProgress {
                task_id: 31337,
                completed: true,
            },
            TaskProgress {
                task_id: task.task_id,
                completed: true,
            },
        ],
    })
    .await
    .unwrap();
    let info = c
        .client_heartbeat(ClientHeartbeatRequest {
            iteration_client_id: client_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(info.iteration_finished);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_sharding_gives_each_listed_worker_its_index() {
    let cluster = Cluster::start(1, &["--tfdata-worker-addresses", "a:%port%,b:7000"]);
    let mut c = client(&cluster.nodes[0].addr).await;
    let e = c.worker_heartbeat(heartbeat("c:1", &[])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    c.worker_heartbeat(heartbeat("b:7000", &[])).await.unwrap();
    c.worker_heartbeat(heartbeat("a:5123", &[])).await.unwrap();
    let ds = register(&mut c).await;
    let job_id = c
        .get_or_create_job(job(&ds, 3))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    c.get_or_create_iteration(GetOrCreateIterationRequest {
        job_id,
        repetition: 1,
    })
    .await
    .unwrap();
    for (worker, index) in [("a:5123", 0), ("b:7000", 1)] {
        let hb = c.worker_heartbeat(heartbeat(worker, &[])).await.unwrap();
        let def = &hb.into_inner().new_tasks[0];
        assert_eq!((def.num_workers, def.worker_index), (2, index), "{worker}");
        assert_eq!(def.processing_mode_def.unwrap().sharding_policy, 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_leader_calls_get_unavailable_and_a_follower_forwards() {
    let mut cluster = Cluster::start(3, &["--leader-wait-ms", "1500"]);
    let leader = cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let follower = (leader + 1) % 3;
    let mut c = client(&cluster.nodes[follower].addr).await;
    let ds = register(&mut c).await;
    let job_id = c
        .get_or_create_job(job(&ds, 0))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    // Alone, the follower knows no leader: UNAVAILABLE (TF retries it),
    // never NOT_FOUND for what exists.
    for i in 0..3 {
        if i != follower {
            cluster.kill(i);
        }
    }
    let e = c
        .get_or_create_iteration(GetOrCreateIterationRequest {
            job_id,
            repetition: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    let e = c
        .get_data_service_metadata(GetDataServiceMetadataRequest { dataset_id: ds })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    // GetVersion needs no leader.
    assert_eq!(
        c.get_version(GetVersionRequest {})
            .await
            .unwrap()
            .into_inner()
            .version,
        9
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_removed_once_every_consumer_asks_for_the_same_round() {
    let cluster = Cluster::start(1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let mut c = client(&addr).await;
    c.worker_heartbeat(heartbeat("w:1", &[])).await.unwrap();
    let ds = register(&mut c).await;
    let mut rr = job(&ds, 0);
    rr.optional_num_consumers =
        Some(get_or_create_job_request::OptionalNumConsumers::NumConsumers(2));
    let job_id = c.get_or_create_job(rr).await.unwrap().into_inner().job_id;
    c.get_or_create_iteration(GetOrCreateIterationRequest {
        job_id,
        repetition: 1,
    })
    .await
    .unwrap();
    let task_id = c
        .worker_heartbeat(heartbeat("w:1", &[]))
        .await
        .unwrap()
        .into_inner()
        .new_tasks[0]
        .task_id;
    let ask = |consumer_index, round| {
        let addr = addr.clone();
        tokio::spawn(async move {
            client(&addr)
                .await
                .maybe_remove_task(MaybeRemoveTaskRequest {
                    task_id,
                    consumer_index,
                    round,
                })
                .await
                .unwrap()
                .into_inner()
                .removed
        })
    };
    // Consumers asking for different rounds remove nothing.
    let (a, b) = (ask(0, 5), ask(1, 6));
    assert_eq!((a.await.unwrap(), b.await.unwrap()), (false, false));
    // Both asking for the same round: removed, for both.
    let (a, b) = (ask(0, 7), ask(1, 7));
    assert_eq!((a.await.unwrap(), b.await.unwrap()), (true, true));
    let hb = c
        .worker_heartbeat(heartbeat("w:1", &[task_id]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.tasks_to_delete, vec![task_id], "the worker drops it");
}
