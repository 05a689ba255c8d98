//! PyTorch's c10d TCPStore protocol on coordstore's client ports, with
//! stock torch 2.15.0 (CPU, gloo; `target/torch-venv`, made by
//! `scripts/setup-torch.sh`) and torch's own libuv server as the reference:
//! one op script answered alike by both, gloo jobs whose store is
//! coordstore, a leader's death and every node's death in turn under a
//! running job, bad input, and two jobs in two namespaces.

use std::time::Duration;

use agent::torch::StoreClient;
use bytes::{BufMut, Bytes, BytesMut};
use coordstore_tests::jax::{torch_python, PyProc};
use coordstore_tests::wait::{holds, wait};
use coordstore_tests::{free_port, Cluster, NodeProc};
use proto::torch::{encode, put_bytes, Op, MAX_KEY_BYTES, MAX_KEY_COUNT, MAX_VALUE_BYTES};

const WAIT: Duration = Duration::from_secs(60);
/// How long a whole gloo job may take (torch's start-up is seconds on a
/// loaded 2-core machine).
const JOB: Duration = Duration::from_secs(240);

/// Runs the differential op script against `host:port` (`None`: torch's
/// own libuv server, in the script's process): its output lines.
fn op_script(target: Option<&str>, log_dir: &std::path::Path) -> Vec<String> {
    let args: Vec<String> = match target {
        None => vec!["--self-host".into()],
        Some(addr) => {
            let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
            vec!["--host".into(), host.into(), "--port".into(), port.into()]
        }
    };
    let mut p = PyProc::spawn_with(&torch_python(), "torch_store_ops.py", &args, log_dir, &[]);
    let status = p.wait_exit(Duration::from_secs(200));
    assert!(status.success(), "{status}\n{}", p.report());
    p.lines()
}

/// The first line where `got` differs from `want`, for messages.
fn first_difference(want: &[String], got: &[String]) -> String {
    let i = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    format!(
        "line {i}: torch's server {:?}, coordstore {:?}",
        want.get(i),
        got.get(i)
    )
}

#[test]
fn the_op_script_answers_as_torchs_own_server_does() {
    let dir = tempfile::tempdir().unwrap();
    let reference = op_script(None, dir.path());
    assert!(
        reference.len() > 100 && reference.last().unwrap().contains("summary"),
        "{reference:?}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    // One node.
    let one = Cluster::start(1, &[]);
    rt.block_on(one.wait_leader(&[0], WAIT));
    let got = op_script(Some(&one.nodes[0].addr), dir.path());
    assert!(got == reference, "{}", first_difference(&reference, &got));
    drop(one);
    // Three nodes, through a follower, then through a relay.
    let three = Cluster::start(3, &[]);
    let leader = rt.block_on(three.wait_leader(&[0, 1, 2], WAIT));
    let follower = (leader + 1) % 3;
    let got = op_script(Some(&three.nodes[follower].addr), dir.path());
    assert!(got == reference, "{}", first_difference(&reference, &got));
    let relay_addr = format!("127.0.0.1:{}", free_port());
    let _relay = NodeProc::relay(&relay_addr, &three.addrs(), dir.path());
    let got = op_script(Some(&relay_addr), dir.path());
    assert!(
        got == reference,
        "{}\n{}",
        first_difference(&reference, &got),
        three.logs()
    );
}

/// Starts `world` ranks of `torch_gloo.py` against `addr`.
fn gloo_job(addr: &str, world: usize, extra: &[&str], dir: &std::path::Path) -> Vec<PyProc> {
    let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
    (0..world)
        .map(|rank| {
            let mut args: Vec<String> = [
                "--rank",
                &rank.to_string(),
                "--world",
                &world.to_string(),
                "--host",
                host,
                "--port",
                port,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra.iter().map(|s| s.to_string()));
            PyProc::spawn_with(&torch_python(), "torch_gloo.py", &args, dir, &[])
        })
        .collect()
}

/// Waits for every rank to finish cleanly: the store counter rank 0 read.
fn finished(ranks: &mut [PyProc], context: impl Fn() -> String) -> i64 {
    for r in ranks.iter_mut() {
        let status = r.wait_exit(JOB);
        assert!(status.success(), "{status}\n{}\n{}", r.report(), context());
        assert!(
            r.lines().iter().any(|l| l.contains("\"ok\": true")),
            "{}",
            r.report()
        );
    }
    let done = ranks[0]
        .lines()
        .into_iter()
        .find(|l| l.starts_with("{\"done\""))
        .expect("rank 0's last line");
    let v: serde_json::Value = serde_json::from_str(&done).unwrap();
    v["done"]["counter"].as_i64().expect("a counter")
}

#[test]
fn a_gloo_job_all_reduces_over_a_coordstore_store_given_in_code_or_by_env() {
    let cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let follower = &cluster.nodes[(leader + 1) % 3].addr;
    // init_process_group(store=TCPStore(coordstore)).
    let args = [
        "--rounds",
        "3",
        "--adds-per-round",
        "5",
        "--counter",
        "in-code",
    ];
    let mut ranks = gloo_job(follower, 4, &args, cluster.dir.path());
    assert_eq!(finished(&mut ranks, || cluster.logs()), 4 * 3 * 5);
    // env://, every rank a client (TORCHELASTIC_USE_AGENT_STORE).
    let args = ["--init", "env", "--rounds", "2", "--counter", "by-env"];
    let mut ranks = gloo_job(follower, 4, &args, cluster.dir.path());
    assert_eq!(finished(&mut ranks, || cluster.logs()), 4 * 2 * 5);
}

#[test]
fn a_gloo_job_through_a_follower_rides_through_the_leaders_death() {
    let mut cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let follower = cluster.nodes[(leader + 1) % 3].addr.clone();
    let args = ["--rounds", "40", "--adds-per-round", "5"];
    let mut ranks = gloo_job(&follower, 4, &args, cluster.dir.path());
    // Killed while every rank adds and all-reduces.
    ranks[0].wait_line_starting("{\"rank\": 0, \"round\": 2,", WAIT);
    cluster.kill(leader);
    let counter = finished(&mut ranks, || cluster.logs());
    assert_eq!(counter, 4 * 40 * 5, "every add applied once");
}

#[test]
fn gloo_ranks_behind_a_relay_ride_through_every_nodes_death_in_turn() {
    let mut cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let relay_addr = format!("127.0.0.1:{}", free_port());
    let _relay = NodeProc::relay(&relay_addr, &cluster.addrs(), cluster.dir.path());
    let args = ["--init", "env", "--rounds", "1000", "--adds-per-round", "2"];
    let mut ranks = gloo_job(&relay_addr, 4, &args, cluster.dir.path());
    let mut round = 1;
    for i in 0..3 {
        // Each node dies under load, then comes back before the next dies.
        round += 3;
        ranks[0].wait_line_starting(&format!("{{\"rank\": 0, \"round\": {round},"), JOB);
        cluster.kill(i);
        round += 3;
        ranks[0].wait_line_starting(&format!("{{\"rank\": 0, \"round\": {round},"), JOB);
        cluster.restart(i);
        rt.block_on(cluster.wait_converged(&[0, 1, 2], WAIT));
    }
    let counter = finished(&mut ranks, || cluster.logs());
    assert_eq!(counter, 4 * 1000 * 2, "every add applied once");
}

/// A raw client of `addr`'s TCPStore protocol.
async fn raw(addr: &str) -> StoreClient {
    StoreClient::connect(addr, 7).await.expect("connect")
}

/// The head of a request whose key field claims `n` bytes.
fn key_prefix(op: u8, n: u64) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_u8(op);
    b.put_u64_le(n);
    b.to_vec()
}

#[test]
fn bad_input_ends_only_its_connection_and_applies_nothing() {
    let cluster = Cluster::start(1, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let addr = cluster.nodes[0].addr.clone();
    rt.block_on(async {
        // A waiter parked before any bad input is still answered after.
        let mut waiter = raw(&addr).await;
        waiter
            .send(&Op::Wait {
                keys: vec!["/canary".into()],
            })
            .await
            .unwrap();
        let mut ok = raw(&addr).await;
        ok.set("/counter", b"not a number").await.unwrap();

        // Bytes that are no protocol: the gRPC side refuses them.
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let garbage = b"GET / HTTP/1.1\r\nHost: coordstore\r\nAccept: */*\r\n\r\n";
        tokio::io::AsyncWriteExt::write_all(&mut s, garbage)
            .await
            .unwrap();
        let mut sink = Vec::new();
        let read = tokio::io::AsyncReadExt::read_to_end(&mut s, &mut sink);
        let _ = tokio::time::timeout(WAIT, read).await.expect("closed");

        // A VALIDATE with a wrong number: no answer; closed when more bytes
        // come (bytes sent with it, in its read, do not count: each look
        // sends more).
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let mut hello = BytesMut::new();
        encode(&Op::Validate(0x1234_5678), &mut hello);
        tokio::io::AsyncWriteExt::write_all(&mut s, &hello)
            .await
            .unwrap();
        let s = tokio::sync::Mutex::new(s);
        wait("a bad VALIDATE's connection to close", WAIT)
            .until(|| async {
                let mut s = s.lock().await;
                let mut ping = BytesMut::new();
                encode(&Op::Ping(1), &mut ping);
                if tokio::io::AsyncWriteExt::write_all(&mut *s, &ping)
                    .await
                    .is_err()
                {
                    return Ok(());
                }
                let mut buf = [0u8; 16];
                let read = tokio::io::AsyncReadExt::read(&mut *s, &mut buf);
                match tokio::time::timeout(Duration::from_millis(100), read).await {
                    Ok(Ok(0) | Err(_)) => Ok(()),
                    Ok(Ok(n)) => panic!("a bad VALIDATE was answered: {:?}", &buf[..n]),
                    Err(_) => Err("still open"),
                }
            })
            .await;

        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("an unknown op, a SET behind it", {
                let mut b = vec![19u8];
                let mut set = BytesMut::new();
                encode(
                    &Op::Set {
                        key: "/after-19".into(),
                        value: Bytes::from_static(b"x"),
                    },
                    &mut set,
                );
                b.extend_from_slice(&set);
                b
            }),
            ("a second VALIDATE", {
                let mut b = BytesMut::new();
                encode(&Op::Validate(proto::torch::VALIDATE_MAGIC), &mut b);
                b.to_vec()
            }),
            (
                "a key one byte over the limit",
                key_prefix(1, MAX_KEY_BYTES as u64 + 1),
            ),
            ("a value one byte over the limit", {
                let mut b = BytesMut::new();
                b.put_u8(1);
                put_bytes(&mut b, b"/big");
                b.put_u64_le(MAX_VALUE_BYTES as u64 + 1);
                b.to_vec()
            }),
            ("too many keys", {
                let mut b = BytesMut::new();
                b.put_u8(6);
                b.put_u64_le(MAX_KEY_COUNT + 1);
                b.to_vec()
            }),
            ("a length of 2^64-1", key_prefix(3, u64::MAX)),
            ("ADD on a value that is not a number", {
                let mut b = BytesMut::new();
                encode(
                    &Op::Add {
                        key: "/counter".into(),
                        delta: 1,
                    },
                    &mut b,
                );
                b.to_vec()
            }),
            ("a key that is not UTF-8", {
                let mut b = BytesMut::new();
                b.put_u8(1);
                put_bytes(&mut b, &[0x2f, 0xff, 0xfe]);
                put_bytes(&mut b, b"v");
                b.to_vec()
            }),
        ];
        for (what, bytes) in cases {
            let mut c = raw(&addr).await;
            c.send_raw(&bytes).await.unwrap();
            let closed = tokio::time::timeout(WAIT, c.closed()).await;
            assert!(
                matches!(closed, Ok(Ok(()))),
                "{what}: not closed: {closed:?}"
            );
        }
        // Cut short, then closed: nothing applied; a MULTI_SET keeps the
        // pairs that arrived whole (as torch's server applies pair by pair).
        let mut c = raw(&addr).await;
        let mut set = BytesMut::new();
        encode(
            &Op::Set {
                key: "/cut".into(),
                value: Bytes::from_static(b"value"),
            },
            &mut set,
        );
        c.send_raw(&set[..set.len() - 1]).await.unwrap();
        drop(c);
        let mut c = raw(&addr).await;
        let mut multi = BytesMut::new();
        let pairs = ["/m1", "/m2", "/m3"]
            .iter()
            .map(|k| (k.to_string(), Bytes::from_static(b"v")))
            .collect();
        encode(&Op::MultiSet { pairs }, &mut multi);
        c.send_raw(&multi[..multi.len() - 1]).await.unwrap();
        // The pairs that arrived are applied before the connection's end.
        wait("the whole MULTI_SET pairs to apply", WAIT)
            .until(|| async {
                let v = raw(&addr).await.get("/m2").await.unwrap();
                holds(v.as_ref() == b"v", || v)
            })
            .await;
        drop(c);

        // Nothing else was applied; everyone else is still served.
        for key in ["/after-19", "/big", "/cut", "/m3"] {
            assert!(!ok.check(&[key]).await.unwrap(), "{key} was applied");
        }
        assert_eq!(ok.get("/counter").await.unwrap().as_ref(), b"not a number");
        ok.set("/canary", b"1").await.unwrap();
        let released = tokio::time::timeout(WAIT, waiter.u8()).await;
        assert!(matches!(released, Ok(Ok(0))), "{released:?}");
    });
}

#[test]
fn two_torch_jobs_in_two_namespaces_never_meet() {
    let (low, high) = coordstore_tests::free_port_range(&["127.0.0.1"], 4);
    let range = format!("{low}-{high}");
    let cluster = Cluster::start(1, &["--namespace-ports", &range]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let addr = &cluster.nodes[0].addr;
    let mut ports = Vec::new();
    for job in ["job-a", "job-b"] {
        let (ok, out, err) = rt.block_on(coordstore_tests::coordstore_cli(&[
            "ctl",
            "--endpoint",
            addr,
            "ns",
            "create",
            job,
            "--tasks",
            "1",
        ]));
        assert!(ok, "{out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        ports.push(v["port"].as_u64().unwrap());
    }
    rt.block_on(async {
        let at = |p: u64| format!("127.0.0.1:{p}");
        let mut a = raw(&at(ports[0])).await;
        let mut b = raw(&at(ports[1])).await;
        let mut main = raw(addr).await;
        a.set("/rank0/nccl-id", b"job a's").await.unwrap();
        b.set("/rank0/nccl-id", b"job b's").await.unwrap();
        assert_eq!(a.add("init/", 1).await.unwrap(), 1);
        assert_eq!(b.add("init/", 1).await.unwrap(), 1);
        assert_eq!(a.get("/rank0/nccl-id").await.unwrap().as_ref(), b"job a's");
        assert_eq!(b.get("/rank0/nccl-id").await.unwrap().as_ref(), b"job b's");
        assert!(!main.check(&["/rank0/nccl-id"]).await.unwrap());
        assert_eq!(a.num_keys().await.unwrap(), 2);
    });
    // The keys show in the namespace's view.
    let (ok, out, err) = rt.block_on(coordstore_tests::coordstore_cli(&[
        "ctl",
        "--endpoint",
        addr,
        "ns",
        "get",
        "job-a",
    ]));
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["torch"]["keys"], 2, "{out}");
    let (ok, out, err) = rt.block_on(coordstore_tests::coordstore_cli(&[
        "ctl",
        "--endpoint",
        addr,
        "--namespace",
        "job-b",
        "kv",
        "ls",
        "--torch",
        "/rank0",
    ]));
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["key"], "/rank0/nccl-id", "{out}");
    assert_eq!(v[0]["value"], "job b's", "{out}");
}

#[test]
fn a_waiting_rank_parks_and_is_bounded_by_max_parked_calls() {
    let cluster = Cluster::start(1, &["--max-parked-calls", "2"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let addr = cluster.nodes[0].addr.clone();
    rt.block_on(async {
        let mut waiters = Vec::new();
        for _ in 0..2 {
            let mut w = raw(&addr).await;
            w.send(&Op::Wait {
                keys: vec!["/id".into()],
            })
            .await
            .unwrap();
            waiters.push(w);
        }
        coordstore_tests::wait_parked(&addr, 2, WAIT).await;
        // A third: past the bound, its connection ends.
        let mut third = raw(&addr).await;
        third
            .send(&Op::Wait {
                keys: vec!["/id".into()],
            })
            .await
            .unwrap();
        let closed = tokio::time::timeout(WAIT, third.closed()).await;
        assert!(matches!(closed, Ok(Ok(()))), "{closed:?}");
        let mut setter = raw(&addr).await;
        setter.set("/id", b"nccl").await.unwrap();
        for w in &mut waiters {
            assert_eq!(w.u8().await.unwrap(), 0);
            assert_eq!(w.get("/id").await.unwrap().as_ref(), b"nccl");
        }
    });
}
