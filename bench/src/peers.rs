//! The peers every suite compares, started in the same run on this machine:
//! coordstore with 3 nodes and with 1 node, etcd 3.4 with 3 members, and
//! jaxlib's built-in coordination service (in memory, not replicated: the
//! latency floor). coordstore and the built-in service are driven through
//! the same `xla.coordination` gRPC calls the stock jaxlib client sends;
//! etcd through its own v3 gRPC API.

use std::time::{Duration, Instant};

use coordstore_tests::jax::PyProc;
use coordstore_tests::wait::wait;
use coordstore_tests::{free_port, http_get, wire, Cluster};
use proto::xla::coordination_service_client::CoordinationServiceClient;
use proto::xla::{
    GetKeyValueRequest, Incarnations, InsertKeyValueRequest, KeyValueEntry, RegisterTaskRequest,
    TryGetKeyValueRequest,
};
use tonic::transport::Channel;

use crate::etcd::{self, pb, EtcdCluster};

/// Which peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
pub enum PeerKind {
    /// coordstore, 3 nodes, clients on the leader.
    Coordstore3,
    /// coordstore, 1 node.
    Coordstore1,
    /// etcd 3.4, 3 members, clients on the leader.
    Etcd3,
    /// jaxlib 0.12's built-in service.
    Builtin,
}

impl PeerKind {
    /// Every peer, in table order.
    pub const ALL: [PeerKind; 4] = [
        PeerKind::Coordstore3,
        PeerKind::Coordstore1,
        PeerKind::Etcd3,
        PeerKind::Builtin,
    ];

    /// The name in tables and charts.
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Coordstore3 => "coordstore 3 nodes",
            PeerKind::Coordstore1 => "coordstore 1 node",
            PeerKind::Etcd3 => "etcd 3.4, 3 members",
            PeerKind::Builtin => "jaxlib built-in",
        }
    }

    /// Whether it speaks the xla coordination protocol (barriers, blocking get).
    pub fn is_xla(self) -> bool {
        self != PeerKind::Etcd3
    }
}

/// Extra `coordstore serve` flags for every coordstore peer of this run
/// (`coordstore-bench --server-flags`), e.g. to compare configurations.
pub static SERVER_FLAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Every this many ms, while a coordstore peer runs, fetch what the status
/// page (`/ui`) fetches to refresh itself — the cluster, the namespaces and
/// the default namespace's view, as JSON — from each node's metrics
/// listener (`coordstore-bench --ui-refresh-ms`): the serving path's
/// numbers with the page open. Unset: no page.
pub static UI_REFRESH_MS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// A thread refreshing the status page of one coordstore peer; stops
/// when dropped. The count of refreshes it made is logged then.
pub struct UiRefresher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl UiRefresher {
    /// A refresher of the nodes whose metrics listeners are `metrics`, if
    /// `--ui-refresh-ms` asked for one.
    pub fn maybe(metrics: &[String]) -> Option<UiRefresher> {
        let ms = *UI_REFRESH_MS.get()?;
        (!metrics.is_empty()).then(|| Self::start(metrics.to_vec(), Duration::from_millis(ms)))
    }

    fn start(metrics: Vec<String>, every: Duration) -> UiRefresher {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            const PATHS: [&str; 3] = [
                "/ui/api/cluster",
                "/ui/api/namespaces",
                "/ui/api/namespaces/default",
            ];
            let mut refreshes = 0;
            while !flag.load(Ordering::Relaxed) {
                for addr in &metrics {
                    for path in PATHS {
                        if matches!(http_get(addr, path), Some((200, _))) {
                            refreshes += 1;
                        }
                    }
                }
                std::thread::park_timeout(every);
            }
            refreshes
        });
        UiRefresher {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for UiRefresher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let n = t.join().unwrap_or(0);
            eprintln!("status page: {n} JSON views fetched (200 OK)");
        }
    }
}

/// Heartbeat timeout given to the xla peers: long enough that the load
/// generator's registered tasks need no heartbeats during a suite.
pub const HEARTBEAT_TIMEOUT_S: u64 = 600;

enum Inner {
    Coordstore(Cluster),
    Etcd(EtcdCluster),
    Builtin {
        proc: PyProc,
        addr: String,
        _dir: tempfile::TempDir,
    },
}

/// A running peer.
pub struct Peer {
    /// Which one.
    pub kind: PeerKind,
    inner: Inner,
    /// The xla service incarnation (0 for etcd), learnt at registration.
    pub service_incarnation: u64,
    /// How long registering every task took, ms (xla peers).
    pub register_ms: f64,
    /// Each coordstore node's `--metrics-listen` address (none for the
    /// other peers).
    metrics: Vec<String>,
    /// The status page refreshing (`--ui-refresh-ms`), coordstore only.
    _ui: Option<UiRefresher>,
}

impl Peer {
    /// Starts `kind` for a job of `tasks` tasks (xla peers) and waits until
    /// it serves; for xla peers every task is registered (which also tells
    /// the service incarnation).
    pub async fn start(kind: PeerKind, tasks: u32) -> anyhow::Result<Peer> {
        Self::start_with(kind, tasks, &[]).await
    }

    /// As [`Peer::start`], with extra `coordstore serve` flags.
    pub async fn start_with(kind: PeerKind, tasks: u32, extra: &[&str]) -> anyhow::Result<Peer> {
        let hb = Duration::from_secs(HEARTBEAT_TIMEOUT_S);
        let mut peer = Self::launch_with(kind, tasks, hb, extra).await?;
        if kind.is_xla() {
            peer.register_all(tasks.max(1) as usize).await?;
        }
        Ok(peer)
    }

    /// Starts `kind` for a job of `tasks` tasks with heartbeat timeout
    /// `heartbeat_timeout` and waits until it serves, registering no task.
    pub async fn launch(
        kind: PeerKind,
        tasks: u32,
        heartbeat_timeout: Duration,
    ) -> anyhow::Result<Peer> {
        Self::launch_with(kind, tasks, heartbeat_timeout, &[]).await
    }

    async fn launch_with(
        kind: PeerKind,
        tasks: u32,
        heartbeat_timeout: Duration,
        extra: &[&str],
    ) -> anyhow::Result<Peer> {
        let (inner, metrics) = match kind {
            PeerKind::Coordstore3 | PeerKind::Coordstore1 => {
                let (cluster, metrics) =
                    Self::launch_coordstore(kind, tasks, heartbeat_timeout, extra).await;
                (Inner::Coordstore(cluster), metrics)
            }
            PeerKind::Etcd3 => {
                let c = EtcdCluster::start(3)?;
                c.wait_leader(&[0, 1, 2], Duration::from_secs(60)).await?;
                (Inner::Etcd(c), Vec::new())
            }
            PeerKind::Builtin => (
                Self::launch_builtin(tasks, heartbeat_timeout).await?,
                Vec::new(),
            ),
        };
        let ui = UiRefresher::maybe(&metrics);
        Ok(Peer {
            kind,
            inner,
            service_incarnation: 0,
            register_ms: 0.0,
            metrics,
            _ui: ui,
        })
    }

    /// Starts a coordstore peer of `kind` (1 or 3 nodes, each with its own
    /// `--metrics-listen` address) and waits for its leader; the cluster and
    /// the metrics addresses.
    async fn launch_coordstore(
        kind: PeerKind,
        tasks: u32,
        heartbeat_timeout: Duration,
        extra: &[&str],
    ) -> (Cluster, Vec<String>) {
        let tasks_s = tasks.to_string();
        let hb = heartbeat_timeout.as_millis().to_string();
        let n = if kind == PeerKind::Coordstore3 { 3 } else { 1 };
        // coordstore's own default Raft timing, as etcd runs with its own.
        let mut flags = vec![
            "--tasks",
            &tasks_s,
            "--heartbeat-timeout-ms",
            &hb,
            "--raft-heartbeat-ms",
            "100",
            "--election-timeout-ms",
            "1000",
        ];
        flags.extend_from_slice(extra);
        flags.extend(SERVER_FLAGS.get().into_iter().flatten().map(String::as_str));
        let metrics: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let m = metrics.clone();
        let cluster = Cluster::start_each(n, &flags, move |i| {
            vec!["--metrics-listen".into(), m[i].clone()]
        });
        let all: Vec<usize> = (0..n).collect();
        cluster.wait_leader(&all, Duration::from_secs(60)).await;
        (cluster, metrics)
    }

    /// Starts jaxlib's built-in service for `tasks` tasks and waits until
    /// it listens.
    async fn launch_builtin(tasks: u32, heartbeat_timeout: Duration) -> anyhow::Result<Inner> {
        let dir = tempfile::tempdir()?;
        let proc = PyProc::spawn(
            "builtin_service.py",
            &[
                "--num-tasks".into(),
                tasks.to_string(),
                "--heartbeat-timeout".into(),
                heartbeat_timeout.as_secs().max(1).to_string(),
                "--seconds".into(),
                "7200".into(),
            ],
            dir.path(),
        );
        let addr = wait("the built-in service to start", Duration::from_secs(60))
            .context(|| proc.report())
            .until(|| {
                let listening = proc
                    .lines()
                    .iter()
                    .find_map(|l| l.strip_prefix("LISTENING ").map(str::to_string));
                async move { listening.ok_or("no LISTENING line") }
            })
            .await;
        Ok(Inner::Builtin {
            proc,
            addr,
            _dir: dir,
        })
    }

    /// Registers tasks 0..n at once, over ⌈n/128⌉ connections to the
    /// leader: an xla RegisterTask returns only when every task of the job
    /// has registered. Records the service incarnation and the time taken.
    async fn register_all(&mut self, n: usize) -> anyhow::Result<()> {
        let addr = self.leader_addr().await?;
        let mut clients = Vec::new();
        for _ in 0..n.div_ceil(128) {
            clients.push(CoordinationServiceClient::new(channel(&addr).await));
        }
        let t0 = Instant::now();
        let mut calls = Vec::new();
        for task in 0..n {
            let mut c = clients[task % clients.len()].clone();
            calls.push(tokio::spawn(async move {
                c.register_task(RegisterTaskRequest {
                    incarnation: 1,
                    source_task_id: task as i32,
                })
                .await
            }));
        }
        for c in calls {
            let r = tokio::time::timeout(Duration::from_secs(120), c).await???;
            self.service_incarnation = r.into_inner().service_incarnation;
        }
        self.register_ms = t0.elapsed().as_secs_f64() * 1000.0;
        Ok(())
    }

    /// The service incarnation xla requests carry.
    pub fn service_incarnation(&self) -> u64 {
        self.service_incarnation
    }

    /// Number of server processes.
    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Coordstore(c) => c.nodes.len(),
            Inner::Etcd(c) => c.members.len(),
            Inner::Builtin { .. } => 1,
        }
    }

    /// Whether there is no server process (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Client address of server `i`.
    pub fn addr(&self, i: usize) -> String {
        match &self.inner {
            Inner::Coordstore(c) => c.nodes[i].addr.clone(),
            Inner::Etcd(c) => c.members[i].addr.clone(),
            Inner::Builtin { addr, .. } => addr.clone(),
        }
    }

    /// The Prometheus exposition of server `i` (coordstore peers; None for
    /// the others, or if it does not answer).
    pub async fn metrics(&self, i: usize) -> Option<String> {
        let addr = self.metrics.get(i)?.clone();
        tokio::task::spawn_blocking(move || http_get(&addr, "/metrics"))
            .await
            .ok()
            .flatten()
            .and_then(|(status, body)| (status == 200).then_some(body))
    }

    /// Process id of server `i`.
    pub fn pid(&self, i: usize) -> Option<u32> {
        match &self.inner {
            Inner::Coordstore(c) => c.nodes[i].pid(),
            Inner::Etcd(c) => c.members[i].pid(),
            Inner::Builtin { proc, .. } => Some(proc.pid()),
        }
    }

    /// Index of the leader among the servers in `among` (0 for the built-in).
    pub async fn leader_among(&self, among: &[usize], wait: Duration) -> anyhow::Result<usize> {
        match &self.inner {
            Inner::Coordstore(c) => Ok(c.wait_leader(among, wait).await),
            Inner::Etcd(c) => c.wait_leader(among, wait).await,
            Inner::Builtin { .. } => Ok(0),
        }
    }

    /// Index of the current leader.
    pub async fn leader(&self) -> anyhow::Result<usize> {
        let all: Vec<usize> = (0..self.len()).collect();
        self.leader_among(&all, Duration::from_secs(60)).await
    }

    /// The leader's client address.
    pub async fn leader_addr(&self) -> anyhow::Result<String> {
        Ok(self.addr(self.leader().await?))
    }

    /// SIGKILLs server `i` (waits for it to exit).
    pub fn kill(&mut self, i: usize) {
        match &mut self.inner {
            Inner::Coordstore(c) => c.kill(i),
            Inner::Etcd(c) => c.members[i].kill(),
            Inner::Builtin { .. } => {}
        }
    }

    /// Starts server `i` again on its data dir.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        match &mut self.inner {
            Inner::Coordstore(c) => c.restart(i),
            Inner::Etcd(c) => c.restart(i)?,
            Inner::Builtin { .. } => anyhow::bail!("the built-in service does not restart"),
        }
        Ok(())
    }

    /// A KV client on `ch` (a channel to one of this peer's servers).
    pub fn client(&self, ch: Channel) -> KvClient {
        if self.kind.is_xla() {
            KvClient::xla(ch, self.service_incarnation)
        } else {
            KvClient::Etcd {
                kv: etcd::kv(ch.clone()),
                watch: pb::watch_client::WatchClient::new(ch),
            }
        }
    }

    /// The servers' logs (errors and tails), for failure messages.
    pub fn logs(&self) -> String {
        match &self.inner {
            Inner::Coordstore(c) => c.logs(),
            Inner::Etcd(c) => c.logs(),
            Inner::Builtin { proc, .. } => proc.report(),
        }
    }

    /// The coordstore cluster, if this is a coordstore peer.
    pub fn coordstore(&mut self) -> Option<&mut Cluster> {
        match &mut self.inner {
            Inner::Coordstore(c) => Some(c),
            _ => None,
        }
    }
}

/// A channel to `addr` (connects with retries for up to 30 s).
pub async fn channel(addr: &str) -> Channel {
    wire::channel(addr).await
}

/// A channel to `addr` that fails calls after `timeout`, for loads that
/// must notice a dead server.
pub async fn channel_with_timeout(addr: &str, timeout: Duration) -> anyhow::Result<Channel> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_millis(300))
            .timeout(timeout)
            .connect_lazy(),
    )
}

/// One load-generator client: the same operations over either protocol.
#[derive(Clone)]
pub enum KvClient {
    /// `xla.coordination` (coordstore, jaxlib's built-in service).
    Xla {
        /// The stub.
        c: CoordinationServiceClient<Channel>,
        /// The incarnations every request carries.
        inc: Option<Incarnations>,
    },
    /// etcd v3.
    Etcd {
        /// KV stub.
        kv: pb::kv_client::KvClient<Channel>,
        /// Watch stub.
        watch: pb::watch_client::WatchClient<Channel>,
    },
}

impl KvClient {
    /// An xla client on `ch` speaking for task 0 of `service_incarnation`.
    pub fn xla(ch: Channel, service_incarnation: u64) -> KvClient {
        KvClient::Xla {
            c: CoordinationServiceClient::new(ch)
                .max_decoding_message_size(1 << 30)
                .max_encoding_message_size(1 << 30),
            inc: Some(Incarnations {
                task_id: 0,
                task_incarnation: 1,
                service_incarnation,
            }),
        }
    }

    /// Sets `key` (overwrite allowed).
    pub async fn put(&mut self, key: &str, value: &[u8]) -> Result<(), tonic::Status> {
        match self {
            KvClient::Xla { c, inc } => c
                .insert_key_value(InsertKeyValueRequest {
                    incarnations: *inc,
                    kv: Some(KeyValueEntry {
                        key: key.into(),
                        value: value.to_vec().into(),
                    }),
                    allow_overwrite: true,
                })
                .await
                .map(|_| ()),
            KvClient::Etcd { kv, .. } => kv
                .put(pb::PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.to_vec(),
                    lease: 0,
                })
                .await
                .map(|_| ()),
        }
    }

    /// Reads `key` linearizably (xla TryGetKeyValue; etcd Range, its
    /// default linearizable read). `None` when absent.
    pub async fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, tonic::Status> {
        match self {
            KvClient::Xla { c, inc } => match c
                .try_get_key_value(TryGetKeyValueRequest {
                    incarnations: *inc,
                    key: key.into(),
                })
                .await
            {
                Ok(r) => Ok(r.into_inner().kv.map(|kv| kv.value.to_vec())),
                Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
                Err(s) => Err(s),
            },
            KvClient::Etcd { kv, .. } => {
                let r = kv
                    .range(pb::RangeRequest {
                        key: key.as_bytes().to_vec(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                Ok(r.kvs.into_iter().next().map(|kv| kv.value))
            }
        }
    }

    /// Starts waiting for `key` to be set; `ready` resolves once the wait is
    /// in place (etcd: the watch is created; xla: the GetKeyValue call is
    /// sent, the server parks it), then the returned future yields when the
    /// value arrives.
    pub async fn wait_for(
        &mut self,
        key: &str,
    ) -> Result<
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, tonic::Status>> + Send>>,
        tonic::Status,
    > {
        match self {
            KvClient::Xla { c, inc } => {
                let mut c = c.clone();
                let req = GetKeyValueRequest {
                    incarnations: *inc,
                    key: key.into(),
                };
                Ok(Box::pin(async move {
                    let r = c.get_key_value(req).await?.into_inner();
                    Ok(r.kv.map(|kv| kv.value.to_vec()).unwrap_or_default())
                }))
            }
            KvClient::Etcd { watch, .. } => {
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                tx.send(pb::WatchRequest {
                    request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                        pb::WatchCreateRequest {
                            key: key.as_bytes().to_vec(),
                            ..Default::default()
                        },
                    )),
                })
                .await
                .map_err(|_| tonic::Status::internal("watch request channel closed"))?;
                let mut stream = watch
                    .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await?
                    .into_inner();
                // The first response confirms the watch.
                match stream.message().await? {
                    Some(r) if r.created => {}
                    other => {
                        return Err(tonic::Status::internal(format!(
                            "watch not created: {other:?}"
                        )))
                    }
                }
                Ok(Box::pin(async move {
                    let _keep_open = tx;
                    while let Some(r) = stream.message().await? {
                        if let Some(ev) = r.events.into_iter().next() {
                            return Ok(ev.kv.map(|kv| kv.value).unwrap_or_default());
                        }
                    }
                    Err(tonic::Status::unavailable("watch stream ended"))
                }))
            }
        }
    }
}
