//! Who may talk to a node: the peer token, TLS on both ports, the admins.

use super::*;

/// Who may talk to the node: the peer token, TLS on both ports, admins.
#[derive(clap::Args, Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct SecurityOptions {
    /// A file holding the cluster's shared peer token (any text; the same on
    /// every node): peer RPCs carry it and are refused without it. Without
    /// it peers are not authenticated [default: none]
    #[arg(long)]
    pub peer_token_file: Option<PathBuf>,
    /// HOST:PORT for peer links only (Raft RPCs and calls forwarded to the
    /// leader), apart from clients; --cluster and --advertise then name
    /// this port [default: none, peers share --listen]
    #[arg(long)]
    pub peer_listen: Option<String>,
    /// PEM certificate chain the client port presents (TLS on; needs
    /// --tls-key) [default: none, plaintext]
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// PEM CA: clients must present a certificate it signed (mutual TLS)
    /// [default: none, any client]
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
    /// With mutual TLS: a client certificate name that may run the
    /// cluster's verbs (namespace create, delete, reset, export, import;
    /// reset-job; snapshot save; member add and remove) and see every
    /// namespace: subject CN or a SAN, `*` matching any run of characters;
    /// repeatable. Without it, with --tls-client-ca no client may run them
    /// [default: none]
    #[arg(long)]
    pub admin_client_name: Vec<String>,
    /// With TLS on the client port: serve PyTorch's TCPStore protocol in
    /// plaintext there too, for the default namespace (torch's client has
    /// no TLS; a relay on the client host is the other way)
    /// (`--torch-plaintext` alone means true) [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub torch_plaintext: Option<bool>,
    /// PEM certificate chain of this node on peer links: presented by the
    /// peer port and when dialing peers (needs --peer-listen, --peer-tls-key
    /// and --peer-tls-ca) [default: none, plaintext]
    #[arg(long)]
    pub peer_tls_cert: Option<PathBuf>,
    /// PEM private key of --peer-tls-cert
    #[arg(long)]
    pub peer_tls_key: Option<PathBuf>,
    /// PEM CA every peer's certificate must be signed by, both ways
    #[arg(long)]
    pub peer_tls_ca: Option<PathBuf>,
}
layered!(SecurityOptions {
    peer_token_file,
    peer_listen,
    tls_cert,
    tls_key,
    tls_client_ca,
    torch_plaintext,
    peer_tls_cert,
    peer_tls_key,
    peer_tls_ca;
    admin_client_name
});

/// TLS of the peer links: what the peer port serves and how peers are
/// dialed (both mutual, with one CA).
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// The peer port: this node's certificate; peers must present one the
    /// peer CA signed.
    pub server: tonic::transport::ServerTlsConfig,
    /// Dialing peers: their certificate must be the peer CA's; this node
    /// presents its own.
    pub client: tonic::transport::ClientTlsConfig,
}

/// The security flags, checked and their files loaded.
pub(super) struct Security {
    pub(super) peer_token: Option<String>,
    pub(super) client_tls: Option<tonic::transport::ServerTlsConfig>,
    pub(super) peer_tls: Option<PeerTls>,
    pub(super) admins: crate::core::Admins,
}

impl SecurityOptions {
    pub(super) fn resolve(&self) -> Result<Security, String> {
        let (client_tls, peer_tls) = self.tls()?;
        if !self.admin_client_name.is_empty() && self.tls_client_ca.is_none() {
            return Err(
                "--admin-client-name needs --tls-client-ca: without client certificates no call has a name"
                    .into(),
            );
        }
        Ok(Security {
            peer_token: self.peer_token()?,
            client_tls,
            peer_tls,
            admins: crate::core::Admins {
                identities: self.tls_client_ca.is_some(),
                names: self.admin_client_name.clone(),
            },
        })
    }

    /// `--peer-token-file`'s token: non-empty printable ASCII.
    pub(super) fn peer_token(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.peer_token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--peer-token-file {}: {e}", path.display()))?;
        let token = text.trim().to_string();
        if token.is_empty() || token.parse::<tonic::metadata::MetadataValue<_>>().is_err() {
            return Err(format!(
                "--peer-token-file {}: the token must be non-empty printable ASCII",
                path.display()
            ));
        }
        Ok(Some(token))
    }

    /// The TLS flags, checked and their files loaded.
    pub(super) fn tls(
        &self,
    ) -> Result<(Option<tonic::transport::ServerTlsConfig>, Option<PeerTls>), String> {
        let client = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(proto::tls::server(
                cert,
                key,
                self.tls_client_ca.as_deref(),
            )?),
            (None, None) if self.tls_client_ca.is_some() => {
                return Err("--tls-client-ca needs --tls-cert and --tls-key".into())
            }
            (None, None) => None,
            _ => return Err("--tls-cert and --tls-key go together".into()),
        };
        let peer = match (&self.peer_tls_cert, &self.peer_tls_key, &self.peer_tls_ca) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca)) => {
                if self.peer_listen.is_none() {
                    return Err(
                        "--peer-tls-* needs --peer-listen: peer links get a port of their own"
                            .into(),
                    );
                }
                Some(PeerTls {
                    server: proto::tls::server(cert, key, Some(ca))?,
                    client: proto::tls::client(ca, Some((cert, key)))?,
                })
            }
            _ => {
                return Err("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together".into())
            }
        };
        if client.is_some() && self.peer_listen.is_none() {
            return Err(
                "with --tls-cert, peer links need a port of their own: give --peer-listen (and --peer-tls-* to secure it)"
                    .into(),
            );
        }
        Ok((client, peer))
    }
}
