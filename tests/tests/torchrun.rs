//! torchrun (stock torch 2.15.0, CPU, gloo; `target/torch-venv`, made by
//! `scripts/setup-torch.sh`, which also installs the coordstore package)
//! with coordstore as the store of both the rendezvous and the workers, so
//! no training host serves a store (`docs/pytorch.md`, torchrun). Each job
//! is two `torchrun` agents (`--nnodes 2 --nproc-per-node 2`) on loopback
//! whose four workers all-reduce over gloo: the c10d backend with stock
//! settings only; `--rdzv-backend coordstore` (the package's handler: the
//! namespace, an in-process relay) through a node's death; an elastic
//! restart after a worker's crash; and a cluster with mutual TLS.

use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use coordstore_tests::jax::{script, torch_python, PyProc};
use coordstore_tests::pki::{self, Ca, Leaf};
use coordstore_tests::wait::{eventually_blocking, holds};
use coordstore_tests::{coordstore_cli, free_port_range, ns, Cluster};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
/// How long a whole torchrun job may take (torch's start-up is seconds per
/// process on a loaded 2-core machine, and there are six of them).
const JOB: Duration = Duration::from_secs(300);

/// torchrun's own flags for node rank `rank` of a 2 × 2 job.
fn torchrun_flags(rank: usize) -> Vec<String> {
    ["--nnodes", "2", "--nproc-per-node", "2", "--node-rank"]
        .iter()
        .map(|s| s.to_string())
        .chain([rank.to_string()])
        .collect()
}

/// Starts node rank `rank`: `torchrun <flags> <rdzv> <program>`, with `env`.
fn agent(
    rank: usize,
    rdzv: &[String],
    program: &[String],
    env: &[(&str, &str)],
    dir: &Path,
) -> PyProc {
    let mut args = torchrun_flags(rank);
    args.extend(rdzv.iter().cloned());
    args.extend(program.iter().cloned());
    let mut env = env.to_vec();
    // gloo binds the address of the host's name unless told an interface:
    // loopback only, whatever the machine's name resolves to.
    env.extend([("OMP_NUM_THREADS", "1"), ("GLOO_SOCKET_IFNAME", "lo")]);
    let mut p = PyProc::spawn_with(&torch_python(), "torchrun_agent.py", &args, dir, &env);
    p.label = format!("torchrun node {rank}");
    p
}

/// The worker script and its arguments, run by torchrun with its Python.
fn worker(args: &[&str]) -> Vec<String> {
    let mut v = vec![script("torchrun_worker.py").display().to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

/// Both agents of a job.
fn agents(rdzv: &[String], program: &[String], env: &[(&str, &str)], dir: &Path) -> Vec<PyProc> {
    (0..2).map(|r| agent(r, rdzv, program, env, dir)).collect()
}

/// The JSON lines the workers printed (on their agents' stdout).
fn lines(agents: &[PyProc]) -> Vec<Value> {
    agents
        .iter()
        .flat_map(|a| a.lines())
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

/// Everyone's stdout and stderr tail, for failure messages.
fn report(agents: &[PyProc]) -> String {
    agents
        .iter()
        .map(PyProc::report)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether process `pid` (a child of this one) has exited: it is gone or
/// a zombie waiting to be reaped.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'))
        })
        .unwrap_or(true)
}

/// The lines of the four workers of attempt `attempt`, once all printed.
fn workers_up(agents: &[PyProc], attempt: u64) -> Result<Vec<Value>, usize> {
    let up: Vec<Value> = lines(agents)
        .into_iter()
        .filter(|v| v["world"] == 4 && v["attempt"] == attempt)
        .collect();
    holds(up.len() == 4, || up.len()).map(|()| up)
}

/// Waits until all four workers of attempt `attempt` started: their lines.
fn started(agents: &mut [PyProc], attempt: u64, context: impl Fn() -> String) -> Vec<Value> {
    eventually_blocking(format!("4 workers of attempt {attempt}"), JOB, || {
        if let Ok(up) = workers_up(agents, attempt) {
            return Ok(up);
        }
        if let Some(i) = agents.iter().position(|a| exited(a.pid())) {
            // Its last lines may still be in the pipe: read them out.
            agents[i].wait_exit(WAIT);
            if let Ok(up) = workers_up(agents, attempt) {
                return Ok(up);
            }
            let label = &agents[i].label;
            panic!("{label} exited\n{}\n{}", report(agents), context());
        }
        workers_up(agents, attempt)
    })
}

/// Waits for both agents to exit 0 with every worker of attempt `attempt`
/// done and all-reduced right.
fn finished(agents: &mut [PyProc], attempt: u64, context: impl Fn() -> String) {
    for i in 0..agents.len() {
        let status = agents[i].wait_exit(JOB);
        assert!(
            status.success(),
            "{status}\n{}\n{}",
            report(agents),
            context()
        );
    }
    let done: Vec<Value> = lines(agents)
        .into_iter()
        .filter(|v| v.get("done").is_some())
        .collect();
    let ranks: BTreeSet<u64> = done
        .iter()
        .filter_map(|v| v["done"]["rank"].as_u64())
        .collect();
    assert_eq!(ranks, (0..4).collect(), "{}", report(agents));
    for d in &done {
        assert_eq!(d["ok"], true, "{d}\n{}", report(agents));
        assert_eq!(d["done"]["attempt"], attempt, "{d}\n{}", report(agents));
    }
}

/// The TCP addresses process `pid` listens on (from /proc: the sockets its
/// descriptors hold, looked up in /proc/net/tcp and tcp6).
fn listening(pid: u64) -> Vec<(IpAddr, u16)> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for row in text.lines().skip(1) {
            let f: Vec<&str> = row.split_whitespace().collect();
            // sl local remote st ... inode (10th)
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                out.push(hex_addr(f[1]));
            }
        }
    }
    out
}

/// A /proc/net/tcp{,6} address: hex words in host (little-endian) order.
fn hex_addr(s: &str) -> (IpAddr, u16) {
    let (ip, port) = s.split_once(':').expect("ADDR:PORT");
    let port = u16::from_str_radix(port, 16).expect("hex port");
    let words: Vec<u32> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).expect("hex word"))
        .collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        _ => IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes).expect("16 bytes"),
        )),
    };
    (ip, port)
}

/// Whether `ip` is a loopback address (an IPv4 one mapped in IPv6 too).
fn is_loopback(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Every worker (by its pid) listens on loopback only: gloo's pair
/// listeners, no TCPStore server (torch's listens on every address).
fn workers_serve_no_store(up: &[Value], agents: &[PyProc]) {
    for w in up {
        let pid = w["pid"].as_u64().expect("a worker's pid");
        let l = listening(pid);
        assert!(
            l.iter().all(|(ip, _)| is_loopback(ip)),
            "worker {w}: {l:?}\n{}",
            report(agents)
        );
    }
}

/// `ctl kv ls --torch` of namespace `namespace` on `addr` (`tls`: ctl's
/// TLS flags): the keys.
fn torch_keys(addr: &str, namespace: &str, tls: &[String]) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut args: Vec<&str> = vec!["ctl", "--endpoint", addr, "--namespace", namespace];
    args.extend(tls.iter().map(String::as_str));
    args.extend(["kv", "ls", "--torch", ""]);
    let (ok, out, err) = rt.block_on(coordstore_cli(&args));
    assert!(ok, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .expect("a list")
        .iter()
        .filter_map(|e| e["key"].as_str().map(String::from))
        .collect()
}

/// Every worker's key of attempt `attempt` is among `keys` (it set it
/// through its process group's store).
fn workers_keys_in(keys: &[String], attempt: u64) {
    for rank in 0..4 {
        let k = format!("torchrun_worker/{attempt}/{rank}");
        assert!(
            keys.iter().any(|key| key.ends_with(&k)),
            "no {k} in {keys:?}"
        );
    }
}

#[test]
fn torchrun_c10d_with_stock_settings_keeps_every_store_on_coordstore() {
    // One node on 127.0.0.1 (a namespace port is served on every node's
    // host: one host, one node).
    let (low, high) = free_port_range(&["127.0.0.1"], 4);
    let cluster = Cluster::start(1, &["--namespace-ports", &format!("{low}-{high}")]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let addr = cluster.nodes[0].addr.clone();
    let info = rt
        .block_on(ns::create(&addr, "job-c10d", ns::tasks(1)))
        .expect("create");
    rt.block_on(ns::wait_serving(&cluster, "job-c10d", WAIT));
    let store = format!("127.0.0.1:{}", info.port);
    let hold = cluster.dir.path().join("hold");
    let rdzv: Vec<String> = ["--rdzv-backend", "c10d", "--rdzv-endpoint", &store]
        .into_iter()
        .chain(["--rdzv-id", "job-c10d", "--rdzv-conf", "is_host=false"])
        .map(String::from)
        .collect();
    // The workers' store: torchrun writes MASTER_ADDR, MASTER_PORT and
    // TORCHELASTIC_USE_AGENT_STORE into each worker's environment from the
    // handler, so the command overrides them (`env`); with sharing off, no
    // agent starts a store for the workers.
    let master_port = format!("MASTER_PORT={}", info.port);
    let python = torch_python().display().to_string();
    let mut program: Vec<String> = ["--no-python", "env", "MASTER_ADDR=127.0.0.1", &master_port]
        .into_iter()
        .chain(["TORCHELASTIC_USE_AGENT_STORE=True", &python, "-u"])
        .map(String::from)
        .collect();
    program.extend(worker(&["--hold-file", &hold.display().to_string()]));
    let env = [("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")];
    let mut agents = agents(&rdzv, &program, &env, cluster.dir.path());

    let up = started(&mut agents, 0, || cluster.logs());
    for w in &up {
        assert_eq!(w["master"], store, "{w}");
        assert_eq!(w["agent_store"], "True", "{w}");
    }
    // No store on a training host: the agents listen on nothing at all,
    // the workers on loopback only (gloo); the workers' keys are in the
    // namespace's store.
    for a in &agents {
        let l = listening(u64::from(a.pid()));
        assert!(
            l.is_empty(),
            "{} listens on {l:?}\n{}",
            a.label,
            report(&agents)
        );
    }
    workers_serve_no_store(&up, &agents);
    workers_keys_in(&torch_keys(&addr, "job-c10d", &[]), 0);
    std::fs::write(&hold, b"go").unwrap();
    finished(&mut agents, 0, || cluster.logs());
}

/// torchrun's rendezvous flags for the coordstore backend on `cluster`
/// (every node), job `id`, and `conf` (rdzv-conf).
fn coordstore_rdzv(cluster: &Cluster, id: &str, conf: &str) -> Vec<String> {
    let mut v: Vec<String> = ["--rdzv-backend", "coordstore", "--rdzv-id", id]
        .into_iter()
        .map(String::from)
        .collect();
    v.extend(["--rdzv-endpoint".to_string(), cluster.addrs().join(",")]);
    if !conf.is_empty() {
        v.extend(["--rdzv-conf".to_string(), conf.to_string()]);
    }
    v
}

#[test]
fn torchrun_coordstore_backend_runs_the_job_on_relays_through_a_nodes_death() {
    let mut cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let hold = cluster.dir.path().join("hold");
    let rdzv = coordstore_rdzv(&cluster, "torchrun-b", "ttl_ms=600000,max_keys=10000");
    let program = worker(&["--rounds", "5", "--hold-file", &hold.display().to_string()]);
    let mut agents = agents(&rdzv, &program, &[], cluster.dir.path());

    let up = started(&mut agents, 0, || cluster.logs());
    // The namespace was made with the job's settings.
    let info = rt
        .block_on(ns::get(&cluster.nodes[1].addr, "torchrun-b"))
        .expect("namespace");
    let settings = info.settings.expect("settings");
    assert_eq!(
        (settings.tasks, settings.ttl_ms, settings.max_keys),
        (1, Some(600_000), Some(10_000))
    );
    // Each agent's workers dial its own relay: a loopback port of the
    // agent, the only address it listens on; nobody serves a TCPStore.
    for a in &agents {
        let l = listening(u64::from(a.pid()));
        let mine: Vec<Value> = up
            .iter()
            .filter(|w| w["agent_pid"] == a.pid())
            .cloned()
            .collect();
        assert_eq!(mine.len(), 2, "{up:?}");
        for w in &mine {
            let (host, port) = w["master"].as_str().unwrap().rsplit_once(':').unwrap();
            assert_eq!(host, "127.0.0.1", "{w}");
            assert_eq!(w["agent_store"], "True", "{w}");
            assert_eq!(l.len(), 1, "{} listens on {l:?}", a.label);
            assert_eq!(
                l[0],
                (IpAddr::V4(Ipv4Addr::LOCALHOST), port.parse().unwrap()),
                "{w}"
            );
        }
    }
    workers_serve_no_store(&up, &agents);
    workers_keys_in(&torch_keys(&cluster.nodes[1].addr, "torchrun-b", &[]), 0);
    // The node every relay dials first dies while the job runs; the
    // agents' heartbeats, the workers and the exit barrier go on.
    cluster.kill(0);
    std::fs::write(&hold, b"go").unwrap();
    finished(&mut agents, 0, || cluster.logs());
}

#[test]
fn torchrun_coordstore_backend_restarts_a_crashed_worker_group() {
    let cluster = Cluster::start(1, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    let mut rdzv = coordstore_rdzv(&cluster, "torchrun-restart", "");
    rdzv.extend(["--max-restarts".into(), "1".into()]);
    let crash = cluster.dir.path().join("crashed");
    let program = worker(&[
        "--crash-rank",
        "1",
        "--crash-file",
        &crash.display().to_string(),
    ]);
    let mut agents = agents(&rdzv, &program, &[], cluster.dir.path());

    // Rank 1 crashes in the first attempt; both agents rendezvous again
    // through coordstore and the second attempt finishes.
    started(&mut agents, 0, || cluster.logs());
    started(&mut agents, 1, || cluster.logs());
    assert!(
        lines(&agents)
            .iter()
            .any(|v| v["crashing"] == true && v["rank"] == 1),
        "{}",
        report(&agents)
    );
    finished(&mut agents, 1, || cluster.logs());
    // The second attempt's workers found their store emptied of the
    // first attempt's keys (stale gloo addresses would have failed it).
    let keys = torch_keys(&cluster.nodes[0].addr, "torchrun-restart", &[]);
    workers_keys_in(&keys, 1);
    assert!(
        !keys.iter().any(|k| k.contains("torchrun_worker/0/")),
        "{keys:?}"
    );
}

/// torchrun's elastic membership on the native rendezvous, with real
/// agents (`--nnodes 1:2`): one agent starts alone (its round forms with
/// one node once the last call passed), a second joins late (the first
/// sees it waiting, stops its worker and both form a round of two), then
/// the second is SIGKILLed (the first's worker fails, its agent restarts,
/// the leader drops the silent agent and the first forms a round alone
/// and finishes).
#[test]
fn torchrun_native_rendezvous_takes_a_late_agent_and_loses_one() {
    let cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let hold = cluster.dir.path().join("hold");
    let conf = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2";
    let mut rdzv = coordstore_rdzv(&cluster, "torchrun-elastic", conf);
    rdzv.extend(["--max-restarts", "3", "--monitor-interval", "0.2"].map(String::from));
    let program = worker(&["--rounds", "2", "--hold-file", &hold.display().to_string()]);
    let elastic = |label: &str| {
        let mut args: Vec<String> = ["--nnodes", "1:2", "--nproc-per-node", "1"]
            .map(String::from)
            .to_vec();
        args.extend(rdzv.iter().cloned());
        args.extend(program.iter().cloned());
        let env = [("OMP_NUM_THREADS", "1"), ("GLOO_SOCKET_IFNAME", "lo")];
        let dir = cluster.dir.path();
        let mut p = PyProc::spawn_with(&torch_python(), "torchrun_agent.py", &args, dir, &env);
        p.label = label.to_string();
        p
    };
    let with_world = |agents: &[PyProc], world: u64| -> Result<usize, usize> {
        let n = lines(agents)
            .iter()
            .filter(|v| v["world"] == world && v.get("round").is_none())
            .count();
        holds(n > 0, || n).map(|()| n)
    };
    let mut agents = vec![elastic("the first agent")];
    eventually_blocking("a worker of a world of 1", JOB, || with_world(&agents, 1));
    agents.push(elastic("the late agent"));
    eventually_blocking("two workers of a world of 2", JOB, || {
        let n = with_world(&agents, 2)?;
        holds(n == 2, || n)
    });
    // SIGKILLed (its workers die with it).
    drop(agents.pop().expect("the late agent"));
    std::fs::write(&hold, b"").unwrap();
    let status = agents[0].wait_exit(JOB);
    let done: Vec<Value> = lines(&agents)
        .into_iter()
        .filter(|v| v.get("done").is_some())
        .collect();
    assert!(
        status.success()
            && done
                .iter()
                .any(|d| d["done"]["world"] == 1 && d["ok"] == true),
        "{status}\n{}\n{}",
        report(&agents),
        cluster.logs()
    );
}

/// A CA for the servers, one for the clients; the node's certificate, the
/// peers', and an admin's (`ops`).
struct Certs {
    _dir: tempfile::TempDir,
    servers: Ca,
    clients: Ca,
    peers: Ca,
    node: Leaf,
    peer: Leaf,
    ops: Leaf,
}

impl Certs {
    fn new() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let servers = Ca::new(dir.path(), "servers");
        let clients = Ca::new(dir.path(), "clients");
        let peers = Ca::new(dir.path(), "peers");
        let hosts = ["127.0.0.1", "localhost"];
        Certs {
            node: servers.issue("node", &hosts),
            peer: peers.issue("peer", &hosts),
            ops: clients.issue("ops", &[]),
            servers,
            clients,
            peers,
            _dir: dir,
        }
    }

    /// A node's flags: mutual TLS on both ports, `ops` the admin, no
    /// plaintext TCPStore anywhere.
    fn node_flags(&self) -> Vec<String> {
        [
            ("--tls-cert", &self.node.cert),
            ("--tls-key", &self.node.key),
            ("--tls-client-ca", &self.clients.cert),
            ("--peer-tls-cert", &self.peer.cert),
            ("--peer-tls-key", &self.peer.key),
            ("--peer-tls-ca", &self.peers.cert),
        ]
        .iter()
        .flat_map(|(f, p)| [f.to_string(), p.display().to_string()])
        .chain(["--admin-client-name".to_string(), "ops".to_string()])
        .collect()
    }

    /// `ctl`'s TLS flags as the admin.
    fn ctl_flags(&self) -> Vec<String> {
        [
            ("--tls-ca", &self.servers.cert),
            ("--tls-cert", &self.ops.cert),
            ("--tls-key", &self.ops.key),
        ]
        .iter()
        .flat_map(|(f, p)| [f.to_string(), p.display().to_string()])
        .collect()
    }
}

#[test]
fn torchrun_coordstore_backend_on_a_cluster_with_mutual_tls() {
    let certs = Certs::new();
    let (cluster, _peers) = pki::cluster(&certs.node_flags(), 1, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tls =
        proto::tls::client(&certs.servers.cert, Some((&certs.ops.cert, &certs.ops.key))).unwrap();
    rt.block_on(pki::wait_leader(&cluster.addrs(), &[0], &tls));
    let addr = cluster.nodes[0].addr.clone();
    // torch's client has no TLS: a plaintext TCPStore is refused here.
    let plaintext = rt.block_on(async {
        let mut c = agent::torch::StoreClient::connect(&addr, 1).await?;
        c.num_keys().await
    });
    assert!(plaintext.is_err(), "{plaintext:?}");

    // The CA by rdzv-conf, the admin's certificate by environment.
    let conf = format!("tls_ca={},ttl_ms=600000", certs.servers.cert.display());
    let rdzv = coordstore_rdzv(&cluster, "torchrun-tls", &conf);
    let (cert, key) = (
        certs.ops.cert.display().to_string(),
        certs.ops.key.display().to_string(),
    );
    let env = [
        ("COORDSTORE_TLS_CERT", cert.as_str()),
        ("COORDSTORE_TLS_KEY", key.as_str()),
    ];
    let program = worker(&[]);
    let mut agents = agents(&rdzv, &program, &env, cluster.dir.path());
    finished(&mut agents, 0, || cluster.logs());
    workers_keys_in(&torch_keys(&addr, "torchrun-tls", &certs.ctl_flags()), 0);
}
