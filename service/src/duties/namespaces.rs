//! The namespace duty: a namespace created with a TTL is deleted by the
//! leader once its job is done (every task shut down, or none ever
//! registered) and it has been quiet (no update applied in it) for the
//! TTL, by the leader's clock. The state holds when each namespace was
//! last active, so a new leader decides the same.

use journal::pb::{update::Command, DeleteNamespace};
use journal::Update;

use super::{Duty, DutyFuture};
use crate::core::{now_ms, LocalLeader};

/// Deletes namespaces whose TTL passed.
#[derive(Default)]
pub struct NamespaceDuty;

impl Duty for NamespaceDuty {
    fn name(&self) -> &'static str {
        "namespaces"
    }

    fn on_takeover<'a>(&'a self, _leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async {})
    }

    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            let now = now_ms();
            let expired: Vec<String> = leader.node().state().read(|s| {
                s.namespaces()
                    .filter(|n| {
                        let ttl = n.spec().map_or(0, |p| p.ttl_ms);
                        ttl > 0 && n.is_done() && now >= n.last_active_ms().saturating_add(ttl)
                    })
                    .map(|n| n.name().to_string())
                    .collect()
            });
            for name in expired {
                tracing::info!(namespace = name, "deleting a namespace whose TTL passed");
                let delete = DeleteNamespace { name };
                let update = Update::from(Command::DeleteNamespace(delete));
                super::propose(self.name(), leader, &update).await;
            }
        })
    }

    fn on_step_down(&self) {}
}
