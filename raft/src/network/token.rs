//! The cluster's peer token and cluster id, attached to every peer RPC and
//! checked on every one received.

#[allow(unused_imports)]
use super::*;

/// gRPC metadata key of the cluster's peer token on peer RPCs.
pub const PEER_TOKEN_HEADER: &str = "x-coordstore-peer-token";

/// gRPC metadata key of the sender's cluster id on peer RPCs.
pub const PEER_CLUSTER_HEADER: &str = "x-coordstore-cluster-id";

/// The cluster's shared peer token, if the cluster has one, and the cluster
/// id peers present.
#[derive(Clone, Default)]
pub struct PeerToken {
    token: Option<Arc<str>>,
    cluster: Option<Arc<str>>,
}

impl PeerToken {
    /// `token`, or none (peers not authenticated).
    pub fn new(token: Option<String>) -> Self {
        PeerToken {
            token: token.map(Arc::from),
            cluster: None,
        }
    }

    /// The same, also presenting (and requiring of peers that present one)
    /// the cluster id `cluster`: a node of another cluster (one restored
    /// from a backup of this one, say) is refused.
    pub fn for_cluster(mut self, cluster: &str) -> Self {
        self.cluster = Some(Arc::from(cluster));
        self
    }

    /// Puts the token and the cluster id on an outgoing request.
    pub fn attach<T>(&self, req: &mut Request<T>) {
        if let Some(t) = &self.token {
            if let Ok(v) = t.parse() {
                req.metadata_mut().insert(PEER_TOKEN_HEADER, v);
            }
        }
        if let Some(c) = &self.cluster {
            if let Ok(v) = c.parse() {
                req.metadata_mut().insert(PEER_CLUSTER_HEADER, v);
            }
        }
    }

    /// Refuses a peer RPC without this cluster's token (when it has one) or
    /// from a node of another cluster (FAILED_PRECONDITION; a sender that
    /// names no cluster, an operator's `ctl`, passes this check).
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let md = req.metadata();
        self.check_presented(
            md.get(PEER_CLUSTER_HEADER).map(|v| v.as_bytes()),
            md.get(PEER_TOKEN_HEADER).map(|v| v.as_bytes()),
        )
    }

    /// [`PeerToken::check`] of what a caller presented: its cluster id and
    /// its token.
    pub fn check_presented(
        &self,
        cluster: Option<&[u8]>,
        token: Option<&[u8]>,
    ) -> Result<(), Status> {
        if let (Some(want), Some(got)) = (&self.cluster, cluster) {
            if got != want.as_bytes() {
                return Err(Status::failed_precondition(format!(
                    "this node is in cluster '{want}', the caller in cluster '{}'",
                    String::from_utf8_lossy(got)
                )));
            }
        }
        let Some(want) = &self.token else {
            return Ok(());
        };
        let got = token.unwrap_or_default();
        // Compare every byte, whatever matches first.
        let same = got.len() == want.len()
            && got
                .iter()
                .zip(want.as_bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(Status::unauthenticated(
                "peer RPCs need this cluster's peer token (--peer-token-file)",
            ))
        }
    }
}
