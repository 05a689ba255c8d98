//! Rolling upgrades against a real earlier build: eb5f867, the last build
//! before namespaces (journal feature level 2), built once and cached by
//! `scripts/setup-prev-build.sh`.
//!
//! * A 3-node cluster of that build is upgraded node by node (SIGTERM,
//!   start on this build with the same data dir), followers first and the
//!   leader last, while a stock jaxlib job (through relays) and a writer
//!   run. After every step the nodes hold the same state digest; while old
//!   nodes remain, a namespace create is refused (FAILED_PRECONDITION
//!   naming the level and the nodes that lack it) and changes nothing; once
//!   the last is upgraded the cluster's level rises by itself and
//!   namespaces work; no acknowledged write is lost.
//! * The old build refuses a data dir this one wrote (its journal format is
//!   this build's level, `journal::FEATURE_LEVEL`).
//! * A node of the old build is not added to a cluster of this level.
//! * A node whose log holds an entry it cannot read stops, naming it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coordstore_tests::jax::PyProc;
use coordstore_tests::wait::{holds, wait};
use coordstore_tests::{
    coordstore_cli, free_port, ns, prev_build_bin, try_status, Cluster, NodeProc, Writer,
};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(60);

/// Acknowledged writes so far of jaxlib task `t` (its --acked file).
fn acked(cluster: &Cluster, t: usize) -> usize {
    std::fs::read_to_string(cluster.dir.path().join(format!("acked-{t}.txt")))
        .map_or(0, |s| s.lines().count())
}

/// Waits until both jaxlib tasks have had `rounds` more writes acknowledged.
fn progress(cluster: &Cluster, rounds: usize, clients: &[PyProc]) {
    let start: Vec<usize> = (0..2).map(|t| acked(cluster, t)).collect();
    wait(
        format!("{rounds} more writes acknowledged by each jaxlib task"),
        WAIT,
    )
    .context(|| {
        let reports: Vec<String> = clients.iter().map(PyProc::report).collect();
        format!("{}\n{}", reports.join("\n"), cluster.logs())
    })
    .until_blocking(|| {
        let now: Vec<usize> = (0..2).map(|t| acked(cluster, t)).collect();
        holds((0..2).all(|t| now[t] >= start[t] + rounds), || {
            format!("{now:?} acknowledged, from {start:?}")
        })
    });
}

/// A writer that puts keys through whichever node answers, recording what
/// was acknowledged; it holds off while `paused`.
struct Background {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

fn start_writer(rt: &tokio::runtime::Runtime, addrs: Vec<String>) -> Background {
    let stop = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let (s, p, a) = (stop.clone(), paused.clone(), acked.clone());
    let task = rt.spawn(async move {
        let mut w = Writer::new();
        let mut n = 0u64;
        while !s.load(Ordering::Acquire) {
            if p.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            let key = format!("upgrade/w{n}");
            for addr in addrs
                .iter()
                .cycle()
                .skip(n as usize % addrs.len())
                .take(addrs.len())
            {
                let Ok(ep) = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                else {
                    continue;
                };
                let Ok(ch) = ep
                    .connect_timeout(Duration::from_millis(300))
                    .connect()
                    .await
                else {
                    continue;
                };
                let mut c = proto::coordstore::node_client::NodeClient::new(ch);
                let put = w.put(&mut c, &key, key.as_bytes(), Duration::from_millis(500));
                if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(3), put).await {
                    a.lock().unwrap().push(key.clone());
                    break;
                }
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    Background {
        stop,
        paused,
        acked,
        task,
    }
}

/// Waits until every node of `cluster` applied the same index with the
/// same state digest, the writer held off meanwhile; returns the digest.
fn converged(rt: &tokio::runtime::Runtime, cluster: &Cluster, writer: &Background) -> String {
    writer.paused.store(true, Ordering::Release);
    let digest = rt.block_on(cluster.wait_converged(&[0, 1, 2], WAIT));
    writer.paused.store(false, Ordering::Release);
    digest
}

/// A namespace create through the node at `addr`.
fn create(rt: &tokio::runtime::Runtime, addr: &str, name: &str) -> Result<(), tonic::Status> {
    rt.block_on(ns::create(addr, name, ns::tasks(1)))
        .map(|_| ())
}

#[test]
fn a_rolling_upgrade_from_the_build_before_namespaces_never_diverges() {
    let prev = prev_build_bin();
    let mut cluster = Cluster::start_bin(&prev, 3, &["--tasks", "2"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let addrs = cluster.addrs();
    // A stock jaxlib job of two tasks, each through a relay of this build
    // on its host (jaxlib ends its process when its connection breaks).
    let relays: Vec<NodeProc> = (0..2)
        .map(|_| {
            let addr = format!("127.0.0.1:{}", free_port());
            NodeProc::relay(&addr, &addrs, cluster.dir.path())
        })
        .collect();
    let mut clients: Vec<PyProc> = (0..2)
        .map(|t| {
            let acked = cluster.dir.path().join(format!("acked-{t}.txt"));
            let args: Vec<String> = [
                "loop",
                "--address",
                &relays[t].addr,
                "--node-id",
                &t.to_string(),
                "--num-tasks",
                "2",
                "--seconds",
                "50",
                "--pause-ms",
                "50",
                "--heartbeat-timeout",
                "10",
                "--acked",
                &acked.display().to_string(),
                "--deadline",
                "240",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            PyProc::spawn("jax_client.py", &args, cluster.dir.path())
        })
        .collect();
    let writer = start_writer(&rt, addrs.clone());
    progress(&cluster, 20, &clients);
    converged(&rt, &cluster, &writer);

    // Followers first, the leader last.
    let mut order: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    order.push(leader);
    for (step, &i) in order.iter().enumerate() {
        // SIGTERM (an old node that does not end while its clients' long
        // polls are open is killed after 10 s: its journal is on disk
        // either way).
        cluster.nodes[i].stop(Duration::from_secs(10));
        cluster.nodes[i].set_bin(None);
        cluster.nodes[i].start();
        rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
        converged(&rt, &cluster, &writer);
        let upgraded: Vec<usize> = order[..=step].to_vec();
        if step + 1 < order.len() {
            // Mixed: the create is refused wherever it arrives, naming the
            // nodes that still run the old build, and changes nothing.
            let old: Vec<usize> = order[step + 1..].to_vec();
            for &at in &upgraded {
                let e = create(&rt, &addrs[at], "during-upgrade").unwrap_err();
                assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
                let m = e.message();
                assert!(
                    m.contains("namespace create needs journal feature level 3 (namespaces)")
                        && m.contains("the cluster runs at level 2"),
                    "{m}"
                );
                for &o in &old {
                    assert!(
                        m.contains(&format!(
                            "node {} (level 2: the builds before namespaces)",
                            o + 1
                        )),
                        "{m}"
                    );
                }
                for &u in &upgraded {
                    assert!(!m.contains(&format!("node {} (", u + 1)), "{m}");
                }
            }
            // Writes at once through an upgraded node while a node of the
            // old build leads: the follower's batch is UNIMPLEMENTED there,
            // and the writes go as single proposals.
            let c = rt.block_on(cluster.client(upgraded[0], WAIT));
            let puts = (0..8).map(|k| {
                let mut c = c.clone();
                async move {
                    let key = format!("mixed/{step}/{k}");
                    Writer::new().put(&mut c, &key, b"v", WAIT).await
                }
            });
            for put in rt.block_on(futures_util::future::join_all(puts)) {
                put.expect("a write through an upgraded node");
            }
            converged(&rt, &cluster, &writer);
            let s = rt.block_on(try_status(&addrs[upgraded[0]])).unwrap();
            assert_eq!(
                (s.feature_level, s.cluster_feature_level),
                (journal::FEATURE_LEVEL, 2)
            );
            assert_eq!(s.namespaces, 1);
        }
        progress(&cluster, 10, &clients);
    }

    // Every node on this build: the level rises by itself, on every node.
    wait("the level to rise on every node", WAIT)
        .context(|| cluster.logs())
        .until_blocking(|| {
            let levels: Vec<Option<u32>> = addrs
                .iter()
                .map(|a| rt.block_on(try_status(a)).map(|s| s.cluster_feature_level))
                .collect();
            holds(
                levels.iter().all(|l| *l == Some(journal::FEATURE_LEVEL)),
                || levels,
            )
        });
    create(&rt, &addrs[order[0]], "after-upgrade")
        .expect("namespaces work once every node is upgraded");
    let mut in_ns = Writer::in_namespace("after-upgrade");
    let mut c = rt.block_on(cluster.client(order[2], WAIT));
    rt.block_on(in_ns.put(&mut c, "k", b"v", WAIT)).unwrap();
    converged(&rt, &cluster, &writer);

    for p in &mut clients {
        let status = p.wait_exit(Duration::from_secs(180));
        assert!(
            status.success() && p.failed_checks().is_empty(),
            "{status}\n{}\n{}",
            p.report(),
            cluster.logs()
        );
    }
    writer.stop.store(true, Ordering::Release);
    rt.block_on(writer.task).unwrap();
    let acked = writer.acked.lock().unwrap().clone();
    assert!(
        acked.len() > 50,
        "the writer got too little through: {}",
        acked.len()
    );
    let mut c = rt.block_on(cluster.client(order[0], WAIT));
    let held = rt.block_on(coordstore_tests::kv_keys(&mut c, "upgrade"));
    let held: std::collections::BTreeSet<String> = held.into_iter().collect();
    let lost: Vec<&String> = acked.iter().filter(|k| !held.contains(*k)).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
}

/// eb5f867 on a data dir this build wrote with a namespace in it: refused
/// at start, with its own message, and the dir left as it was.
#[test]
fn the_build_before_refuses_a_data_dir_this_one_wrote() {
    let mut cluster = Cluster::start(1, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let addr = cluster.nodes[0].addr.clone();
    create(&rt, &addr, "job-a").unwrap();
    // The namespace's own part of the state: a new leader term adds entries
    // of its own to the default namespace (its configuration, again), and
    // every entry moves the state's clock, which the namespace's snapshot
    // carries (an export needs it) but is not the namespace's.
    let job_a = |rt: &tokio::runtime::Runtime| {
        let snapshot = rt
            .block_on(coordstore_tests::journal_state(&addr))
            .namespace_snapshot("job-a")
            .expect("job-a exists");
        let data = <journal::pb::StateData as prost::Message>::decode(&snapshot[..])
            .expect("a namespace's snapshot");
        data.namespaces
    };
    let before = job_a(&rt);
    assert!(cluster.nodes[0].stop(Duration::from_secs(20)).is_some());
    cluster.nodes[0].set_bin(Some(prev_build_bin()));
    cluster.nodes[0].start();
    let status = cluster.nodes[0]
        .wait_exit(WAIT)
        .expect("the old build exits");
    assert!(!status.success());
    let log = cluster.nodes[0].log();
    assert!(
        log.contains(&format!(
            "it holds journal format {}, and this coordstore reads format 2",
            journal::FEATURE_LEVEL
        )),
        "{log}"
    );
    // This build opens it again, unchanged.
    cluster.nodes[0].set_bin(None);
    cluster.nodes[0].start();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let s = rt.block_on(try_status(&addr)).unwrap();
    assert_eq!(s.namespaces, 2);
    assert_eq!(job_a(&rt), before, "job-a's state changed");
}

/// A node of the build before is not added to a cluster that runs at a
/// higher level: it could not apply the cluster's state.
#[test]
fn a_node_of_a_lower_level_is_not_added() {
    let cluster = Cluster::start(1, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let addr = cluster.nodes[0].addr.clone();
    wait("the cluster at this build's level", WAIT)
        .context(|| cluster.logs())
        .until_blocking(|| {
            let level = rt
                .block_on(try_status(&addr))
                .map(|s| s.cluster_feature_level);
            holds(level == Some(journal::FEATURE_LEVEL), || level)
        });
    let joiner_addr = format!("127.0.0.1:{}", free_port());
    let data = cluster.dir.path().join("joiner");
    let mut joiner = NodeProc::serve_with_bin(
        &prev_build_bin(),
        2,
        &joiner_addr,
        &data,
        &[
            "--join",
            "true",
            "--cluster",
            &format!("1={addr},2={joiner_addr}"),
        ],
        cluster.dir.path(),
    );
    rt.block_on(coordstore_tests::connect(&joiner_addr, WAIT));
    let (ok, _, err) = rt.block_on(coordstore_cli(&[
        "ctl",
        "--endpoint",
        &addr,
        "member",
        "add",
        "2",
        &joiner_addr,
    ]));
    assert!(!ok);
    assert!(
        err.contains("FAILED_PRECONDITION")
            && err.contains("node 2 applies journal feature level 2")
            && err.contains(&format!(
                "below the cluster's level {}",
                journal::FEATURE_LEVEL
            )),
        "{err}"
    );
    let s = rt.block_on(try_status(&addr)).unwrap();
    assert_eq!(s.members.len(), 1, "{s:?}");
    // This build's ctl asks a node of the build before, which has no
    // NodeOps (the Node API by audience), through its Node service.
    let (ok, out, err) = rt.block_on(coordstore_cli(&[
        "ctl",
        "--endpoint",
        &joiner_addr,
        "status",
    ]));
    assert!(ok, "ctl status on the build before: {err}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(status["node_id"], 2, "{out}");
    joiner.kill();
}

/// A node whose log holds an entry with a command this build does not know
/// (as a newer build would write it) stops at that entry with an error
/// naming it, instead of skipping it.
#[test]
fn a_node_stops_at_an_entry_it_cannot_read() {
    use journal::pb::{coordination::KvInsert, update::Command, UpdateBatch};
    use prost::Message;
    let mut cluster = Cluster::start(1, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let mut c = rt.block_on(cluster.client(0, WAIT));
    rt.block_on(Writer::new().put(&mut c, "before", b"1", WAIT))
        .unwrap();
    assert!(cluster.nodes[0].stop(Duration::from_secs(20)).is_some());

    // Append an entry of a newer build: an update with a command (field 57)
    // this build does not know, beside one it does.
    let data_dir = cluster.nodes[0].data_dir.clone();
    let index = rt.block_on(async {
        let id = storage::Identity {
            cluster_id: "coordstore".into(),
            node_id: 1,
        };
        let (mut log, _sm) = storage::open(&data_dir, 8 << 20, &id).unwrap();
        use openraft::storage::RaftLogStorage;
        let last = log.get_log_state().await.unwrap().last_log_id.unwrap();
        let known = journal::Update::from(Command::from(KvInsert {
            key: "after".into(),
            value: "2".into(),
            allow_overwrite: true,
        }));
        let mut update = known.encode_to_vec();
        update.extend([0xca, 0x03, 0x00]); // field 57, an empty message
        let mut batch = UpdateBatch {
            updates: vec![known],
        }
        .encode_to_vec();
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut batch);
        prost::encoding::encode_varint(update.len() as u64, &mut batch);
        batch.extend(update);
        let proposal = storage::Proposal::decode(batch.into()).unwrap();
        assert!(proposal.unknown().is_some());
        let index = last.index + 1;
        let entry = storage::Entry {
            log_id: storage::LogId::new(*last.committed_leader_id(), index),
            payload: openraft::EntryPayload::Normal(proposal),
        };
        log.write_entries(vec![entry]).await.unwrap();
        index
    });
    cluster.nodes[0].start();
    let status = cluster.nodes[0].wait_exit(WAIT);
    let log = cluster.nodes[0].log();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the node did not stop: {status:?}\n{log}"
    );
    assert!(
        log.contains(&format!("log entry {index} cannot be applied in full"))
            && log.contains("UpdateBatch.updates: field 57"),
        "{log}"
    );
}
