//! The closure-queue duty: a closure whose worker stopped renewing its lease
//! goes back to its queue. The leader reads the leases that ended by its
//! clock and proposes their expiry; the state puts back each that is still
//! in flight with a lease ended at the update's time (a renewal that came
//! meanwhile wins).

use journal::pb::closures::ExpireLeases;

use super::coordination::in_namespace;
use super::{Duty, DutyFuture};
use crate::core::{now_ms, LocalLeader};

/// A namespace's lapsed leases: queue → closure ids.
type Expired = Vec<(String, Vec<u64>)>;

/// Puts back closures whose lease lapsed.
#[derive(Default)]
pub struct ClosuresDuty;

impl Duty for ClosuresDuty {
    fn name(&self) -> &'static str {
        "closures"
    }

    fn on_takeover<'a>(&'a self, _leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async {})
    }

    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            let now = now_ms();
            let expired: Vec<(String, Expired)> = leader.node().state().read(|s| {
                s.namespaces()
                    .map(|n| (n.key().to_string(), n.closures().expired_leases(now)))
                    .filter(|(_, e)| !e.is_empty())
                    .collect()
            });
            for (ns, queues) in expired {
                for (queue, closure_ids) in queues {
                    tracing::info!(
                        namespace = journal::namespace::namespace_name(&ns),
                        queue,
                        closures = ?closure_ids,
                        "closure leases lapsed: putting the closures back"
                    );
                    let update = in_namespace(&ns, ExpireLeases { queue, closure_ids });
                    super::propose(self.name(), leader, &update).await;
                }
            }
        })
    }

    fn on_step_down(&self) {}
}
