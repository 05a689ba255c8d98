//! The cluster duty: the first leader of a fresh cluster configures the
//! service and draws its incarnation (kept by every later leader).

use std::sync::atomic::{AtomicU64, Ordering};

use journal::pb::{update::Command, ClusterConfig, InitService};
use journal::Update;

use super::{Duty, DutyFuture};
use crate::core::LocalLeader;

/// Proposes `InitService` with this node's configuration while the state is
/// not configured.
pub struct ClusterDuty {
    config: ClusterConfig,
    /// The term in which the configuration was refused (logged once, not
    /// proposed again until a new term).
    refused_in: AtomicU64,
}

impl ClusterDuty {
    /// The duty configuring the service with `config`.
    pub fn new(config: ClusterConfig) -> Self {
        ClusterDuty {
            config,
            refused_in: AtomicU64::new(0),
        }
    }
}

impl Duty for ClusterDuty {
    fn name(&self) -> &'static str {
        "cluster"
    }

    fn on_takeover<'a>(&'a self, _leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async {})
    }

    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            if leader.node().state().read(|s| s.is_initialized()) {
                return;
            }
            let term = leader.leading_term().unwrap_or(0);
            if self.refused_in.load(Ordering::Relaxed) == term {
                return;
            }
            let update = Update::from(Command::InitService(InitService {
                config: Some(self.config.clone()),
                service_incarnation: rand::random(),
            }));
            if let Some(out) = super::propose(self.name(), leader, &update).await {
                if let Some(e) = out.error {
                    tracing::warn!(
                        "this node's cluster configuration was refused: {}",
                        e.message
                    );
                    self.refused_in.store(term, Ordering::Relaxed);
                }
            }
        })
    }

    fn on_step_down(&self) {}
}
