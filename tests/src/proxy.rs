//! A TCP proxy the tests put in front of a node's peer traffic, to cut and
//! heal links (network partitions) without touching the node.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy to one target.
pub struct Proxy {
    /// Where to connect to reach the target through the proxy.
    pub addr: String,
    enabled: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port and forwards to `target`.
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr").to_string();
        let enabled = Arc::new(AtomicBool::new(true));
        let (cut, _) = watch::channel(0u64);
        let (target, on, cuts) = (target.to_string(), enabled.clone(), cut.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                if !on.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (mut a, mut b) = (inbound, outbound);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            enabled,
            cut,
            task,
        }
    }

    /// Cuts the link: open connections drop, new ones are refused.
    pub fn cut(&self) {
        self.enabled.store(false, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Heals the link.
    pub fn heal(&self) {
        self.enabled.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The peer links of a cluster, each through a proxy of its own (node i
/// reaches node j through proxy (i, j)), so a node can be cut off from its
/// peers both ways while its clients still reach it.
pub struct Links {
    proxies: std::collections::HashMap<(usize, usize), Proxy>,
}

impl Links {
    /// Proxies for every ordered pair of the nodes at `addrs`.
    pub async fn start(addrs: &[String]) -> Links {
        let mut proxies = std::collections::HashMap::new();
        for i in 0..addrs.len() {
            for j in (0..addrs.len()).filter(|&j| j != i) {
                proxies.insert((i, j), Proxy::start(&addrs[j]).await);
            }
        }
        Links { proxies }
    }

    /// The `--peer-address` flag and value that route node `i`'s peer
    /// traffic through its proxies (node ids are index + 1).
    pub fn peer_flags(&self, i: usize) -> Vec<String> {
        let mut spec: Vec<(usize, &str)> = self
            .proxies
            .iter()
            .filter(|((from, _), _)| *from == i)
            .map(|((_, to), p)| (*to, p.addr.as_str()))
            .collect();
        spec.sort();
        let spec: Vec<String> = spec
            .into_iter()
            .map(|(to, addr)| format!("{}={addr}", to + 1))
            .collect();
        vec!["--peer-address".to_string(), spec.join(",")]
    }

    /// Cuts every link to and from node `i`.
    pub fn isolate(&self, i: usize) {
        for ((from, to), p) in &self.proxies {
            if *from == i || *to == i {
                p.cut();
            }
        }
    }

    /// Heals every link.
    pub fn heal(&self) {
        for p in self.proxies.values() {
            p.heal();
        }
    }
}
