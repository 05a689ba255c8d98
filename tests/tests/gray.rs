//! Gray failures (docs/faults.md, "Gray failures"): a node that is alive
//! but not working — a leader that hangs (SIGSTOP), a disk that fills, an
//! fdatasync that stalls or fails — while stock clients work through a
//! follower and through a relay: stock torch `TCPStore` clients (a set and
//! an op with a reply in a loop, and a `wait` handed off by the other),
//! two stock jaxlib tasks (key-value and barriers, one on the follower, one
//! through the relay), and the KV workload on the healthy nodes, checked
//! for linearizability. Each node's data dir is on a file system of its own
//! (`lazyfs`) so one disk can fail alone.
//!
//! Each scenario asserts: no error reaches a stock client; the longest
//! pause a stock client sees is at most [`PAUSE_BOUND`]; no acknowledged
//! write is lost; the replicas' digests agree after recovery; and what the
//! failing node did (left at once naming the path and errno, handed
//! leadership over, refused to start on a full disk).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use coordstore_tests::jax::{torch_python, PyProc};
use coordstore_tests::lazyfs::LazyFs;
use coordstore_tests::wait::{holds, wait};
use coordstore_tests::workload::{self, AnyNode, Workload};
use coordstore_tests::{free_port, try_status, Cluster, NodeProc};

const WAIT: Duration = Duration::from_secs(60);

/// The longest pause a stock client may see: an election here (a follower
/// campaigns 0.8-1.2 s after the leader's last heartbeat with the
/// harness's 800 ms election timeout, and a split vote costs up to 0.6 s
/// more) plus one forward attempt cut short by the leader change, with room
/// for a loaded 2-core machine (the measured pauses are in the bench
/// notebook, "Gray failures").
const PAUSE_BOUND: Duration = Duration::from_millis(4000);

/// Three nodes, each on a disk of its own, and a relay.
struct Bed {
    cluster: Cluster,
    disks: Vec<LazyFs>,
    relay: NodeProc,
    /// The leader when the clients started.
    leader: usize,
    /// The node the clients on "a follower" talk to.
    follower: usize,
    _scratch: tempfile::TempDir,
}

impl Bed {
    /// Three nodes with `extra` flags (and `--tasks 2` for the jaxlib
    /// job); the relay's first node is `relay_first(leader, follower)`.
    async fn start(extra: &[&str], relay_first: impl Fn(usize, usize) -> usize) -> Bed {
        let scratch = tempfile::tempdir().expect("temp dir");
        let disks: Vec<LazyFs> = (0..3)
            .map(|i| {
                let (b, m) = (
                    scratch.path().join(format!("disk{i}")),
                    scratch.path().join(format!("mnt{i}")),
                );
                LazyFs::mount(&b, &m)
                    .expect("mounting a FUSE file system (needs /dev/fuse and root)")
            })
            .collect();
        let dirs: Vec<PathBuf> = disks
            .iter()
            .enumerate()
            .map(|(i, d)| d.path().join(format!("node{}", i + 1)))
            .collect();
        let mut flags = vec!["--tasks", "2"];
        flags.extend_from_slice(extra);
        let cluster = Cluster::start_each(3, &flags, |i| {
            vec!["--data-dir".into(), dirs[i].display().to_string()]
        });
        let leader = settled_leader(&cluster).await;
        let follower = (leader + 1) % 3;
        let first = relay_first(leader, follower);
        let mut order = vec![cluster.nodes[first].addr.clone()];
        order.extend(
            (0..3)
                .filter(|&i| i != first)
                .map(|i| cluster.nodes[i].addr.clone()),
        );
        let relay_addr = format!("127.0.0.1:{}", free_port());
        let relay = NodeProc::relay(&relay_addr, &order, cluster.dir.path());
        Bed {
            cluster,
            disks,
            relay,
            leader,
            follower,
            _scratch: scratch,
        }
    }

    fn others(&self, i: usize) -> Vec<usize> {
        (0..3).filter(|&j| j != i).collect()
    }

    fn logs(&self) -> String {
        format!(
            "{}\n--- relay ---\n{}",
            self.cluster.logs(),
            tail(&self.relay.log(), 30)
        )
    }
}

/// The leader once the start-up's elections are over: the same leader
/// twice, with every node caught up in between.
async fn settled_leader(cluster: &Cluster) -> usize {
    wait("a settled leader", WAIT)
        .context(|| cluster.logs())
        .until(|| async {
            let first = cluster.wait_leader(&[0, 1, 2], WAIT).await;
            cluster.wait_converged(&[0, 1, 2], WAIT).await;
            let again = cluster.wait_leader(&[0, 1, 2], WAIT).await;
            holds(first == again, || (first, again)).map(|()| first)
        })
        .await
}

fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(n)..].join("\n")
}

/// The stock clients of one scenario.
struct Clients {
    torch: Vec<PyProc>,
    jax: Vec<PyProc>,
    load: Workload,
    nodes: AnyNode,
    dir: PathBuf,
}

/// What the clients saw.
#[derive(Debug, Default)]
struct Seen {
    /// (client, op, longest pause) of every stock client.
    pauses: Vec<(String, String, Duration)>,
    errors: Vec<String>,
    lost: Vec<String>,
}

impl Seen {
    fn longest(&self) -> Duration {
        self.pauses.iter().map(|p| p.2).max().unwrap_or_default()
    }
}

/// Starts the clients: torch on the follower and through the relay, the
/// jaxlib job's task 0 on the follower and task 1 through the relay (for
/// `seconds` of rounds), the KV workload on `healthy` nodes.
async fn start_clients(bed: &Bed, seconds: u64, healthy: &[usize]) -> Clients {
    let dir = bed.cluster.dir.path().to_path_buf();
    let at = [
        bed.cluster.nodes[bed.follower].addr.clone(),
        bed.relay.addr.clone(),
    ];
    let torch = at
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            let (host, port) = addr.rsplit_once(':').expect("host:port");
            let args: Vec<String> = [
                "--host",
                host,
                "--port",
                port,
                "--prefix",
                &format!("gray{i}"),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let mut p = PyProc::spawn_with(&torch_python(), "torch_gray.py", &args, &dir, &[]);
            p.wait_line("READY", WAIT);
            p
        })
        .collect();
    let jax = at
        .iter()
        .enumerate()
        .map(|(t, addr)| jax_task(addr, t, seconds, &dir))
        .collect();
    let addrs: Vec<String> = healthy
        .iter()
        .map(|&i| bed.cluster.nodes[i].addr.clone())
        .collect();
    let nodes = AnyNode::new(&addrs);
    let load = workload::start(&nodes, 3, 0);
    let clients = Clients {
        torch,
        jax,
        load,
        nodes,
        dir,
    };
    going(bed, &clients, 5).await;
    clients
}

fn jax_task(addr: &str, t: usize, seconds: u64, dir: &std::path::Path) -> PyProc {
    let acked = dir.join(format!("jax-acked-{t}.txt"));
    let args: Vec<String> = [
        "loop",
        "--address",
        addr,
        "--node-id",
        &t.to_string(),
        "--num-tasks",
        "2",
        "--seconds",
        &seconds.to_string(),
        "--pause-ms",
        "20",
        "--heartbeat-timeout",
        "10",
        "--acked",
        &acked.display().to_string(),
        "--deadline",
        &(seconds + 180).to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    PyProc::spawn("jax_client.py", &args, dir)
}

/// Acknowledged jaxlib writes of task `t` so far.
fn jax_acked(dir: &std::path::Path, t: usize) -> usize {
    std::fs::read_to_string(dir.join(format!("jax-acked-{t}.txt"))).map_or(0, |s| s.lines().count())
}

/// Waits until both jaxlib tasks have `more` writes acknowledged beyond
/// now and the workload answers: every client is going.
async fn going(bed: &Bed, c: &Clients, more: usize) {
    let from: Vec<usize> = (0..2).map(|t| jax_acked(&c.dir, t)).collect();
    let ops = c.load.progress().increments;
    wait(
        format!("the clients to go on ({more} more jaxlib rounds each)"),
        WAIT,
    )
    .context(|| {
        let r: Vec<String> = c.jax.iter().chain(&c.torch).map(PyProc::report).collect();
        format!("{}\n{}", r.join("\n"), bed.logs())
    })
    .until(|| async {
        let now: Vec<usize> = (0..2).map(|t| jax_acked(&c.dir, t)).collect();
        let p = c.load.progress();
        holds(
            (0..2).all(|t| now[t] >= from[t] + more) && p.increments > ops,
            || (now.clone(), p),
        )
    })
    .await;
}

/// Stops the clients and collects what they saw; checks the workload's
/// histories against `check_nodes`.
async fn finish(bed: &Bed, mut c: Clients, check_nodes: &[usize]) -> Seen {
    let mut seen = Seen::default();
    for (i, p) in c.torch.iter_mut().enumerate() {
        p.send_line("stop");
        p.wait_exit(WAIT);
        torch_summary(&format!("torch{i}"), p, &mut seen);
    }
    for (t, p) in c.jax.iter_mut().enumerate() {
        p.wait_exit(Duration::from_secs(240));
        jax_summary(&format!("jax task {t}"), p, &mut seen);
    }
    let (recorder, observed) = c.load.stop().await;
    let addrs: Vec<String> = check_nodes
        .iter()
        .map(|&i| bed.cluster.nodes[i].addr.clone())
        .collect();
    let _ = &c.nodes;
    let problems = workload::check(&AnyNode::new(&addrs), &recorder, &observed).await;
    seen.lost
        .extend(problems.into_iter().map(|p| format!("workload: {p}")));
    seen
}

fn summary_of(p: &PyProc, key: &str) -> Option<serde_json::Value> {
    p.lines()
        .iter()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get(key).is_some())
}

fn torch_summary(who: &str, p: &PyProc, seen: &mut Seen) {
    let Some(v) = summary_of(p, "summary") else {
        seen.errors
            .push(format!("{who}: no summary\n{}", p.report()));
        return;
    };
    let s = &v["summary"];
    for (op, ms) in s["max_ms"].as_object().into_iter().flatten() {
        if op != "wait" {
            if let Some(ms) = ms.as_f64() {
                seen.pauses
                    .push((who.into(), op.clone(), Duration::from_secs_f64(ms / 1000.0)));
            }
        }
    }
    for e in s["errors"].as_array().into_iter().flatten() {
        seen.errors.push(format!("{who}: {e}"));
    }
    for l in s["lost"].as_array().into_iter().flatten() {
        seen.lost.push(format!("{who}: {l}"));
    }
}

fn jax_summary(who: &str, p: &PyProc, seen: &mut Seen) {
    let line = p
        .lines()
        .into_iter()
        .find(|l| l.contains("\"check\": \"loop\""));
    let Some(v) = line.and_then(|l| serde_json::from_str::<serde_json::Value>(&l).ok()) else {
        seen.errors
            .push(format!("{who}: no loop summary\n{}", p.report()));
        return;
    };
    let d = &v["detail"];
    for (op, ms) in d["max_latency_ms"].as_object().into_iter().flatten() {
        if let Some(ms) = ms.as_f64() {
            seen.pauses
                .push((who.into(), op.clone(), Duration::from_secs_f64(ms / 1000.0)));
        }
    }
    for e in d["errors"].as_array().into_iter().flatten() {
        seen.errors.push(format!("{who}: {e}"));
    }
    for m in d["missing"].as_array().into_iter().flatten() {
        seen.lost.push(format!("{who}: {m}"));
    }
    if v["ok"] != serde_json::Value::Bool(true)
        && d["errors"].as_array().is_none_or(|e| e.is_empty())
    {
        seen.errors.push(format!("{who}: not ok\n{}", p.report()));
    }
}

/// The assertions every scenario shares, and one report line for the
/// bench notebook (`GRAY_REPORT=file` appends it there).
fn assert_seen(scenario: &str, bed: &Bed, seen: &Seen) {
    let report = serde_json::json!({
        "scenario": scenario,
        "longest_pause_ms": seen.longest().as_millis() as u64,
        "pauses": seen.pauses.iter().map(|(c, op, d)| format!("{c} {op} {} ms", d.as_millis())).collect::<Vec<_>>(),
        "errors": seen.errors.len(),
        "lost": seen.lost.len(),
    });
    eprintln!("gray-report {report}");
    if let Ok(path) = std::env::var("GRAY_REPORT") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{report}");
        }
    }
    assert!(
        seen.errors.is_empty(),
        "{scenario}: errors reached clients: {:#?}\n{}",
        seen.errors,
        bed.logs()
    );
    assert!(
        seen.lost.is_empty(),
        "{scenario}: lost: {:#?}\n{}",
        seen.lost,
        bed.logs()
    );
    assert!(
        seen.longest() <= PAUSE_BOUND,
        "{scenario}: a client paused {} ms (bound {} ms): {:#?}\n{}",
        seen.longest().as_millis(),
        PAUSE_BOUND.as_millis(),
        seen.pauses,
        bed.logs()
    );
}

/// Waits until node `i` has exited; its exit status and the time it took.
fn exited(bed: &mut Bed, i: usize, within: Duration) -> (std::process::ExitStatus, Duration) {
    let t0 = Instant::now();
    let status = bed.cluster.nodes[i].wait_exit(within);
    let status = status.unwrap_or_else(|| {
        panic!(
            "node {} still runs {within:?} after its disk failed\n{}",
            i + 1,
            bed.logs()
        )
    });
    (status, t0.elapsed())
}

/// Waits until the nodes but `old` agree on a leader other than `old`;
/// returns it.
async fn successor(bed: &Bed, old: usize) -> usize {
    let others = bed.others(old);
    wait(format!("a leader other than node {}", old + 1), WAIT)
        .context(|| bed.logs())
        .until(|| async {
            let l = bed.cluster.wait_leader(&others, WAIT).await;
            holds(l != old, || l)
        })
        .await;
    bed.cluster.wait_leader(&others, WAIT).await
}

/// A leader that hangs (a paused VM, a process stuck in the kernel) for
/// `hang`: the others elect, and the clients' calls go there.
async fn leader_hangs(hang: Duration) {
    let bed = Bed::start(&[], |leader, _| leader).await;
    let seconds = hang.as_secs() + 30;
    let healthy = bed.others(bed.leader);
    let clients = start_clients(&bed, seconds, &healthy).await;
    let l = bed.leader;
    let stopped = Instant::now();
    bed.cluster.nodes[l].signal(libc::SIGSTOP);
    successor(&bed, l).await;
    eprintln!("a successor after {:?}", stopped.elapsed());
    // The clients go on while the old leader still hangs.
    going(&bed, &clients, 20).await;
    eprintln!("clients went on after {:?}", stopped.elapsed());
    tokio::time::sleep_until((stopped + hang).into()).await;
    bed.cluster.nodes[l].signal(libc::SIGCONT);
    bed.cluster.wait_leader(&[0, 1, 2], WAIT).await;
    eprintln!("all agree after {:?}", stopped.elapsed());
    going(&bed, &clients, 10).await;
    let seen = finish(&bed, clients, &[0, 1, 2]).await;
    bed.cluster.wait_converged(&[0, 1, 2], WAIT).await;
    assert_seen(&format!("leader hangs {} s", hang.as_secs()), &bed, &seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_hangs_10_s_costs_clients_an_election() {
    leader_hangs(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_hangs_60_s_costs_clients_an_election() {
    leader_hangs(Duration::from_secs(60)).await;
}

/// The reserve a node keeps by default (`--disk-reserve-bytes`).
const RESERVE: u64 = 64 << 20;

/// Node `i`'s disk health, as its status shows it.
async fn disk(bed: &Bed, i: usize) -> Option<proto::coordstore::DiskHealth> {
    try_status(&bed.cluster.nodes[i].addr).await?.disk
}

/// Node `i`, whose disk failed, exited non-zero saying what failed where.
fn left_naming(bed: &mut Bed, i: usize, what: &[&str]) -> Duration {
    let (status, took) = exited(bed, i, WAIT);
    let log = bed.cluster.nodes[i].log();
    assert!(!status.success(), "node {} exited {status}", i + 1);
    let stops = log
        .lines()
        .find(|l| l.contains("stops:"))
        .unwrap_or_default()
        .to_string();
    assert!(
        what.iter().all(|w| stops.contains(w)),
        "node {}'s last words do not name {what:?}: {stops}\n{}",
        i + 1,
        tail(&log, 30)
    );
    eprintln!("node {} left {took:?} after the fault: {stops}", i + 1);
    took
}

/// Restarts node `i` on its disk, still full: it refuses to start, naming
/// the reserve; then frees the disk and starts it again.
async fn restart_on_full_then_freed(bed: &mut Bed, i: usize) {
    bed.disks[i].limit_space(Some(0));
    bed.cluster.nodes[i].set_arg("--disk-reserve-bytes", &RESERVE.to_string());
    bed.cluster.nodes[i].start();
    let (status, _) = exited(bed, i, WAIT);
    let log = bed.cluster.nodes[i].log();
    assert!(
        !status.success() && log.contains("below the reserve of 67108864 (--disk-reserve-bytes)"),
        "node {} started on a full disk ({status})\n{}",
        i + 1,
        tail(&log, 20)
    );
    bed.disks[i].limit_space(None);
    bed.cluster.nodes[i].start();
    bed.cluster.wait_leader(&[0, 1, 2], WAIT).await;
}

/// A leader whose disk fills (no reserve kept: it runs until a write
/// fails) leaves at once, naming the file and ENOSPC; the others elect and
/// the clients go on. Restarted on the still-full disk it refuses to start;
/// with space freed it catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_fills_leaves_at_once() {
    let mut bed = Bed::start(&["--disk-reserve-bytes", "0"], |leader, _| leader).await;
    let l = bed.leader;
    let clients = start_clients(&bed, 60, &bed.others(l)).await;
    bed.disks[l].limit_space(Some(0));
    left_naming(&mut bed, l, &["ENOSPC", "No space left on device"]);
    successor(&bed, l).await;
    going(&bed, &clients, 20).await;
    restart_on_full_then_freed(&mut bed, l).await;
    going(&bed, &clients, 10).await;
    let seen = finish(&bed, clients, &[0, 1, 2]).await;
    bed.cluster.wait_converged(&[0, 1, 2], WAIT).await;
    assert_seen("leader disk full", &bed, &seen);
}

/// A follower whose disk fills leaves the same way; the relay that talked
/// to it moves on, the clients on the other follower see nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_disk_fills_leaves_and_comes_back() {
    let mut bed = Bed::start(&["--disk-reserve-bytes", "0"], |leader, _| (leader + 2) % 3).await;
    let v = (bed.leader + 2) % 3;
    let clients = start_clients(&bed, 60, &bed.others(v)).await;
    bed.disks[v].limit_space(Some(0));
    left_naming(&mut bed, v, &["ENOSPC"]);
    going(&bed, &clients, 20).await;
    restart_on_full_then_freed(&mut bed, v).await;
    going(&bed, &clients, 10).await;
    let seen = finish(&bed, clients, &[0, 1, 2]).await;
    bed.cluster.wait_converged(&[0, 1, 2], WAIT).await;
    assert_seen("follower disk full", &bed, &seen);
}

/// A leader whose fdatasync fails (EIO) leaves at once naming the file and
/// the errno, without retrying the sync; restarted on a healthy disk it
/// catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_fsync_fails_leaves_at_once() {
    let mut bed = Bed::start(&[], |leader, _| leader).await;
    let l = bed.leader;
    let clients = start_clients(&bed, 50, &bed.others(l)).await;
    bed.disks[l].fail_fsyncs(libc::EIO, 1);
    left_naming(&mut bed, l, &["EIO", "fdatasync of"]);
    successor(&bed, l).await;
    going(&bed, &clients, 20).await;
    bed.cluster.nodes[l].start();
    bed.cluster.wait_leader(&[0, 1, 2], WAIT).await;
    going(&bed, &clients, 10).await;
    let seen = finish(&bed, clients, &[0, 1, 2]).await;
    bed.cluster.wait_converged(&[0, 1, 2], WAIT).await;
    assert_seen("leader fsync EIO", &bed, &seen);
}

/// A leader whose fdatasyncs stall for 5 s loses leadership (on this file
/// system a stalled fsync holds the file's writes too, so its Raft core
/// stalls and the others elect; on one where it does not, the node hands
/// leadership over itself: `raft::health`), and shows the stall in its
/// status; the clients see an election at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_fsync_stalls_loses_leadership() {
    let bed = Bed::start(&[], |leader, _| leader).await;
    let l = bed.leader;
    let clients = start_clients(&bed, 40, &bed.others(l)).await;
    let stalled = Instant::now();
    bed.disks[l].set_fsync_delay(Duration::from_secs(5));
    // Its status (served beside the stuck disk) says so.
    wait("the stalled node to say its fdatasync is slow", WAIT)
        .context(|| bed.logs())
        .until(|| async {
            let d = disk(&bed, l).await;
            holds(
                d.as_ref()
                    .is_some_and(|d| d.slow && d.problem.contains("fdatasync")),
                || d,
            )
        })
        .await;
    successor(&bed, l).await;
    going(&bed, &clients, 10).await;
    tokio::time::sleep_until((stalled + Duration::from_secs(5)).into()).await;
    bed.disks[l].set_fsync_delay(Duration::ZERO);
    bed.cluster.wait_leader(&[0, 1, 2], WAIT).await;
    going(&bed, &clients, 10).await;
    let seen = finish(&bed, clients, &[0, 1, 2]).await;
    bed.cluster.wait_converged(&[0, 1, 2], WAIT).await;
    assert_seen("leader fsync stalls 5 s", &bed, &seen);
}

/// A leader whose free space falls below its reserve hands leadership to a
/// healthy voter before anything fails, keeps running, says why in its
/// status, and clears the alarm by itself once space is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_below_its_disk_reserve_hands_leadership_over() {
    let bed = Bed::start(&[], |leader, _| leader).await;
    let l = bed.leader;
    let clients = start_clients(&bed, 40, &bed.others(l)).await;
    bed.disks[l].limit_space(Some(RESERVE / 4));
    successor(&bed, l).await;
    let d = disk(&bed, l).await.expect("the node runs");
    assert!(
        d.low && d.transfers >= 1 && d.last_transfer.contains("below the reserve"),
        "{d:?}"
    );
    going(&bed, &clients, 20).await;
    bed.disks[l].limit_space(None);
    wait("the alarm to clear", WAIT)
        .until(|| async {
            let d = disk(&bed, l).await;
            holds(
                d.as_ref().is_some_and(|d| !d.low && d.problem.is_empty()),
                || d,
            )
        })
        .await;
    let seen = finish(&bed, clients, &[0, 1, 2]).await;
    bed.cluster.wait_converged(&[0, 1, 2], WAIT).await;
    assert_seen("leader below its disk reserve", &bed, &seen);
}

/// With every disk below its reserve no voter can take over: the leader
/// refuses client writes with RESOURCE_EXHAUSTED naming the reserve before
/// the disk is full (nothing applied), and takes them again once space is
/// freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_no_voter_can_replace_refuses_writes_until_space_is_freed() {
    use journal::pb::{coordination::KvInsert, update::Command as Cmd};
    use journal::Update;
    use prost::Message;
    let bed = Bed::start(&[], |leader, _| leader).await;
    for d in &bed.disks {
        d.limit_space(Some(RESERVE / 4));
    }
    let mut c = bed.cluster.client(bed.follower, WAIT).await;
    let propose = |key: &'static str| {
        let mut c = c.clone();
        let u = Update {
            command: Some(Cmd::from(KvInsert {
                key: key.into(),
                value: b"refused".to_vec().into(),
                allow_overwrite: true,
            })),
            ..Default::default()
        };
        let req = proto::coordstore::ProposeRequest {
            update: u.encode_to_vec().into(),
        };
        async move { c.propose(req).await }
    };
    wait("writes to be refused", WAIT)
        .context(|| bed.logs())
        .until(|| async {
            match propose("full/probe").await {
                Err(s) if s.code() == tonic::Code::ResourceExhausted => Ok(()),
                other => Err(other.map(|_| "applied").map_err(|s| s.to_string())),
            }
        })
        .await;
    let refused = propose("full/key").await.expect_err("refused");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("below the reserve")
            && refused.message().contains("no healthy voter"),
        "{refused:?}"
    );
    assert_eq!(
        coordstore_tests::kv_get(&mut c, "full/key").await,
        None,
        "a refused write applied"
    );
    for d in &bed.disks {
        d.limit_space(None);
    }
    let mut w = coordstore_tests::Writer::new();
    w.put(&mut c, "full/key", b"taken", WAIT)
        .await
        .expect("taken once space is freed");
    assert_eq!(
        coordstore_tests::kv_get(&mut c, "full/key")
            .await
            .as_deref(),
        Some(&b"taken"[..])
    );
}
