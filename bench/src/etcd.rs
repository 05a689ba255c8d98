//! The etcd peer: a 3-member etcd 3.4 cluster on loopback, from Debian's
//! binaries that `scripts/setup-bench.sh` unpacks into `target/etcd` (no
//! system install). Members run with etcd's defaults (heartbeat 100 ms,
//! election 1000 ms, fsync on); processes die with the benchmark
//! (`PR_SET_PDEATHSIG`) and are SIGKILLed on drop.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use coordstore_tests::free_port;
use tonic::transport::Channel;

/// Generated stubs of the etcd v3 API subset in `proto/etcd.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::kv_client::KvClient;
use pb::maintenance_client::MaintenanceClient;

/// One etcd member process.
pub struct Member {
    /// Member name (n1..).
    pub name: String,
    /// Client address HOST:PORT.
    pub addr: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Member {
    fn spawn(&mut self, bin: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new(bin);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: prctl is async-signal-safe; the member dies with us.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(cmd.spawn()?);
        Ok(())
    }

    /// SIGKILLs the member and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 3-member (or `n`-member) etcd cluster in a temp dir.
pub struct EtcdCluster {
    /// The members.
    pub members: Vec<Member>,
    bin: PathBuf,
    /// Data dirs and logs (dropped after the members: field order).
    pub dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members on free loopback ports with etcd's default timing.
    pub fn start(n: usize) -> anyhow::Result<EtcdCluster> {
        Self::start_with(n, &[])
    }

    /// As [`EtcdCluster::start`], with `extra` flags for every member.
    pub fn start_with(n: usize, extra: &[&str]) -> anyhow::Result<EtcdCluster> {
        let bin = crate::tools()?.etcd.clone();
        let dir = tempfile::tempdir()?;
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("n{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut args: Vec<String> = vec![
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                dir.path().join(&name).display().to_string(),
                "--listen-client-urls".into(),
                client_url.clone(),
                "--advertise-client-urls".into(),
                client_url,
                "--listen-peer-urls".into(),
                peer_url.clone(),
                "--initial-advertise-peer-urls".into(),
                peer_url,
                "--initial-cluster".into(),
                initial.clone(),
                "--initial-cluster-state".into(),
                "new".into(),
                "--initial-cluster-token".into(),
                format!("bench-{}", std::process::id()),
                "--logger".into(),
                "zap".into(),
                "--log-level".into(),
                "warn".into(),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            let mut m = Member {
                name: name.clone(),
                addr: format!("127.0.0.1:{client}"),
                args,
                log: dir.path().join(format!("{name}.log")),
                child: None,
            };
            m.spawn(&bin)?;
            members.push(m);
        }
        Ok(EtcdCluster { members, bin, dir })
    }

    /// The data dir of member `i`.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.members[i].name)
    }

    /// Restarts member `i` on its data dir.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.members[i].kill();
        let bin = self.bin.clone();
        self.members[i].spawn(&bin)
    }

    /// Waits until every running member in `among` names the same leader;
    /// returns the leader's member index.
    pub async fn wait_leader(&self, among: &[usize], wait: Duration) -> anyhow::Result<usize> {
        let leader =
            coordstore_tests::wait::wait(format!("etcd: an agreed leader among {among:?}"), wait)
                .context(|| self.logs())
                .until(|| async {
                    let mut ids = Vec::new();
                    let mut leader_of = None;
                    for &i in among {
                        if let Some(s) = status(&self.members[i].addr).await {
                            let me = s.header.as_ref().map_or(0, |h| h.member_id);
                            if s.leader != 0 {
                                ids.push(s.leader);
                            }
                            if s.leader == me && me != 0 {
                                leader_of = Some(i);
                            }
                        }
                    }
                    if ids.len() == among.len() && ids.windows(2).all(|w| w[0] == w[1]) {
                        if let Some(i) = leader_of {
                            return Ok(i);
                        }
                    }
                    Err(ids)
                })
                .await;
        Ok(leader)
    }

    /// The tail of every member's log.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = std::fs::read_to_string(&m.log).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "--- etcd {} ---\n{}",
                    m.name,
                    lines[lines.len().saturating_sub(20)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Maintenance.Status of the member at `addr`, if it answers within a second.
pub async fn status(addr: &str) -> Option<pb::StatusResponse> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(1))
        .connect()
        .await
        .ok()?;
    MaintenanceClient::new(ch)
        .status(pb::StatusRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// A KV client on `ch`.
pub fn kv(ch: Channel) -> KvClient<Channel> {
    KvClient::new(ch)
}
