//! Lazily connected tonic channels to peers, cached by node id and address.

#[allow(unused_imports)]
use super::*;

/// Connection timeout of peer channels.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Lazily connected tonic channels to peers, cached by node id and address.
/// An override replaces the membership address of a peer for this node only
/// (a proxy in front of the peer, a different network path).
#[derive(Clone)]
pub struct Channels {
    cache: Arc<Mutex<HashMap<NodeId, (String, Channel)>>>,
    overrides: Arc<HashMap<NodeId, String>>,
    tls: Option<tonic::transport::ClientTlsConfig>,
}

impl Default for Channels {
    fn default() -> Self {
        Self::new()
    }
}

impl Channels {
    /// An empty cache.
    pub fn new() -> Self {
        Self::with_overrides(HashMap::new())
    }

    /// An empty cache that reaches the peers in `overrides` at those addresses.
    pub fn with_overrides(overrides: HashMap<NodeId, String>) -> Self {
        Channels {
            cache: Arc::new(Mutex::new(HashMap::new())),
            overrides: Arc::new(overrides),
            tls: None,
        }
    }

    /// The same, dialing peers over TLS with `tls` (None: plaintext).
    pub fn with_tls(mut self, tls: Option<tonic::transport::ClientTlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    /// The TLS peers are dialed with, if any.
    pub fn tls(&self) -> Option<&tonic::transport::ClientTlsConfig> {
        self.tls.as_ref()
    }

    /// The channel to node `id` at `addr` (host:port), created on first use
    /// and replaced when the address changes.
    pub fn get(&self, id: NodeId, addr: &str) -> Result<Channel, String> {
        let addr = self.overrides.get(&id).map_or(addr, String::as_str);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((a, ch)) = cache.get(&id) {
            if a == addr {
                return Ok(ch.clone());
            }
        }
        let mut endpoint = Endpoint::from_shared(proto::tls::uri(addr, self.tls.is_some()))
            .map_err(|e| format!("bad peer address {addr}: {e}"))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| format!("peer TLS for {addr}: {e}"))?;
        }
        let endpoint = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let ch = endpoint.connect_lazy();
        cache.insert(id, (addr.to_string(), ch.clone()));
        Ok(ch)
    }
}
