//! Certificate authorities and certificates for TLS tests (rcgen), written
//! as PEM files into a directory; clusters of nodes with TLS, and dialing
//! them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{StatusRequest, StatusResponse};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::wait::eventually;
use crate::{free_port, Cluster};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority whose certificate is `dir/NAME-ca.pem`.
pub struct Ca {
    name: String,
    params: CertificateParams,
    key: KeyPair,
    dir: PathBuf,
    /// Its certificate (PEM file).
    pub cert: PathBuf,
}

/// A certificate and its key (PEM files).
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The certificate chain.
    pub cert: PathBuf,
    /// The private key.
    pub key: PathBuf,
}

/// A cluster's certificates in a temporary directory: the CAs of servers,
/// clients and peers, and the node's and the peer's certificate (for
/// 127.0.0.1 and localhost). Clients get theirs from [`Pki::client`].
pub struct Pki {
    /// Where the PEM files are (removed on drop).
    pub dir: tempfile::TempDir,
    /// The CA the nodes' client-port certificates are signed by.
    pub servers: Ca,
    /// The CA client certificates are signed by (`--tls-client-ca`).
    pub clients: Ca,
    /// The CA of the peer links.
    pub peers: Ca,
    /// Every node's client-port certificate.
    pub node: Leaf,
    /// Every node's peer certificate.
    pub peer: Leaf,
}

impl Pki {
    /// New CAs and the nodes' certificates.
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("certificate dir");
        let servers = Ca::new(dir.path(), "servers");
        let clients = Ca::new(dir.path(), "clients");
        let peers = Ca::new(dir.path(), "peers");
        let hosts = ["127.0.0.1", "localhost"];
        Pki {
            node: servers.issue("node", &hosts),
            peer: peers.issue("peer", &hosts),
            servers,
            clients,
            peers,
            dir,
        }
    }

    /// A client certificate for `cn`, also named by `sans`.
    pub fn client(&self, cn: &str, sans: &[&str]) -> Leaf {
        self.clients.issue(cn, sans)
    }

    /// Every node's TLS flags: mutual TLS on both ports.
    pub fn node_flags(&self) -> Vec<String> {
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
        .collect()
    }

    /// What a client dials with as `who`.
    pub fn tls(&self, who: &Leaf) -> ClientTlsConfig {
        proto::tls::client(&self.servers.cert, Some((&who.cert, &who.key))).expect("client TLS")
    }

    /// `ctl`'s TLS flags as `who`.
    pub fn ctl_tls(&self, who: &Leaf) -> Vec<String> {
        [
            ("--tls-ca", &self.servers.cert),
            ("--tls-cert", &who.cert),
            ("--tls-key", &who.key),
        ]
        .iter()
        .flat_map(|(f, p)| [f.to_string(), p.display().to_string()])
        .collect()
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

impl Ca {
    /// A new self-signed CA named `name`, its files in `dir`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let path = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&path, cert.pem()).expect("write CA");
        Ca {
            name: name.to_string(),
            params,
            key,
            dir: dir.to_path_buf(),
            cert: path,
        }
    }

    /// A certificate for `cn`, valid for `sans` (host names or IP
    /// addresses), for servers and clients both.
    pub fn issue(&self, cn: &str, sans: &[&str]) -> Leaf {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate().expect("leaf key");
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign leaf");
        let base = format!("{}-{cn}", self.name);
        let leaf = Leaf {
            cert: self.dir.join(format!("{base}.pem")),
            key: self.dir.join(format!("{base}-key.pem")),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("write certificate");
        std::fs::write(&leaf.key, key.serialize_pem()).expect("write key");
        leaf
    }
}

/// A channel to `addr` over TLS with `tls`, or why the handshake or call
/// setup failed.
pub async fn dial(addr: &str, tls: ClientTlsConfig) -> Result<Channel, String> {
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// The status of the node at `addr` over `tls` (None: plaintext).
pub async fn status(addr: &str, tls: Option<ClientTlsConfig>) -> Result<StatusResponse, String> {
    let ch = match tls {
        Some(tls) => dial(addr, tls).await?,
        None => Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?,
    };
    NodeClient::new(ch)
        .status(StatusRequest {})
        .await
        .map(|r| r.into_inner())
        .map_err(|e| format!("{e:?}"))
}

/// Waits until the nodes `among` (client addresses) agree on a leader among
/// them; returns its index.
pub async fn wait_leader(addrs: &[String], among: &[usize], tls: &ClientTlsConfig) -> usize {
    let what = format!("an agreed leader among {among:?}");
    eventually(what, Duration::from_secs(60), || async {
        let mut leaders = Vec::new();
        for &i in among {
            leaders.push(
                status(&addrs[i], Some(tls.clone()))
                    .await
                    .map(|s| s.leader_id),
            );
        }
        if let Ok(first) = &leaders[0] {
            let idx = among.iter().position(|&i| i as u64 + 1 == *first);
            if idx.is_some() && leaders.iter().all(|l| l.as_ref() == Ok(first)) {
                return Ok(*first as usize - 1);
            }
        }
        Err(leaders)
    })
    .await
}

/// Starts `n` nodes with the TLS flags `flags` (and `extra`), each with a
/// peer port of its own (TLS needs one); returns the cluster and the peer
/// addresses.
pub fn cluster(flags: &[String], n: usize, extra: &[&str]) -> (Cluster, Vec<String>) {
    let addrs: Vec<String> = (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let peers: Vec<String> = (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let members = peers
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
    all.extend(extra);
    let peer_addrs = peers.clone();
    let cluster = Cluster::start_at(&addrs, &all, move |i| {
        vec![
            "--peer-listen".into(),
            peer_addrs[i].clone(),
            "--cluster".into(),
            members.clone(),
        ]
    });
    (cluster, peers)
}

/// Waits until the nodes at `addrs` (over `tls`) have applied the same
/// index and hold the same state digest; returns the digest.
pub async fn wait_converged(addrs: &[String], tls: &ClientTlsConfig) -> String {
    eventually(
        format!("{addrs:?} to converge"),
        Duration::from_secs(60),
        || async {
            let mut seen = Vec::new();
            for a in addrs {
                seen.push(status(a, Some(tls.clone())).await.ok());
            }
            let all: Vec<&StatusResponse> = seen.iter().flatten().collect();
            if all.len() == addrs.len()
                && all.windows(2).all(|w| {
                    (w[0].last_applied, &w[0].state_digest)
                        == (w[1].last_applied, &w[1].state_digest)
                })
            {
                return Ok(all[0].state_digest.clone());
            }
            Err(all
                .iter()
                .map(|s| (s.node_id, s.last_applied, s.state_digest.clone()))
                .collect::<Vec<_>>())
        },
    )
    .await
}
