//! The closure-queue area, read-only: queue stats, closures, listings,
//! and what the leader runtime reads (leases that lapsed).

use super::*;

/// The closure-queue area, read-only.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    pub(crate) data: &'a Data,
}

/// What an operator counts of one queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue.
    pub name: String,
    /// Closures waiting for room in the queue.
    pub pending: u64,
    /// Closures queued for a worker.
    pub queued: u64,
    /// Closures in flight.
    pub running: u64,
    /// Records kept (every state).
    pub records: u64,
}

impl<'a> Reader<'a> {
    /// Counts of every queue, by name.
    pub fn stats(&self) -> Vec<QueueStats> {
        self.data
            .queues
            .values()
            .map(|q| QueueStats {
                name: q.name.clone(),
                pending: q.pending.len() as u64,
                queued: q.queued.len() as u64,
                running: q.running.len() as u64,
                records: q.closures,
            })
            .collect()
    }

    /// A queue by name.
    pub fn queue(&self, name: &str) -> Option<&'a Queue> {
        self.data.queues.get(name)
    }

    /// Every queue, by name.
    pub fn queues(&self) -> impl Iterator<Item = &'a Queue> + 'a {
        self.data.queues.values()
    }

    /// A closure by id.
    pub fn closure(&self, id: u64) -> Option<&'a Closure> {
        self.data.closures.get(&id)
    }

    /// Closures of `queue` with ids above `after`, in id order, with
    /// `tag` when it is not empty; at most `limit` (0 = all).
    pub fn list(&self, queue: &str, tag: &str, after: u64, limit: usize) -> Vec<&'a Closure> {
        let it = self
            .data
            .closures
            .range(after.saturating_add(1)..)
            .map(|(_, c)| c)
            .filter(|c| c.queue == queue && (tag.is_empty() || c.tag == tag));
        if limit == 0 {
            it.collect()
        } else {
            it.take(limit).collect()
        }
    }

    /// The answer of a parked get.
    pub(crate) fn get_answer(&self, queue: &str, call_id: u64) -> GetAnswer<'a> {
        let Some(q) = self.queue(queue) else {
            return GetAnswer::Gone;
        };
        if let Some(a) = q.answers.iter().rev().find(|a| a.call_id == call_id) {
            return match self.closure(a.closure_id) {
                Some(c) => GetAnswer::Assigned(c),
                None => GetAnswer::Gone,
            };
        }
        if q.get_waiters.iter().any(|w| w.call_id == call_id) {
            GetAnswer::Waiting
        } else {
            GetAnswer::Gone
        }
    }

    /// Whether a join of `queue` would answer now: it has an error to
    /// raise, or nothing queued, pending or in flight (or it is gone).
    pub(crate) fn join_ready(&self, queue: &str) -> bool {
        self.queue(queue)
            .is_none_or(|q| q.error.is_some() || q.is_idle())
    }

    /// Closure `id` of `queue` if it is settled, `None` while it is not;
    /// an error if the queue or the closure (in that queue) is unknown.
    pub fn settled(&self, queue: &str, id: u64) -> Result<Option<&'a Closure>, DomainError> {
        if self.queue(queue).is_none() {
            return Err(errors::queue_not_found(queue));
        }
        let Some(c) = self.closure(id).filter(|c| c.queue == queue) else {
            return Err(errors::closure_not_found(queue, id));
        };
        Ok(c.is_settled().then_some(c))
    }

    /// Closures in flight whose lease ended at or before `now_ms`, by queue.
    pub fn expired_leases(&self, now_ms: u64) -> Vec<(String, Vec<u64>)> {
        self.data
            .queues
            .values()
            .filter_map(|q| {
                let ids: Vec<u64> = q
                    .running
                    .iter()
                    .filter(|(_, until)| **until <= now_ms)
                    .map(|(id, _)| *id)
                    .collect();
                (!ids.is_empty()).then(|| (q.name.clone(), ids))
            })
            .collect()
    }

    /// The earliest lease end of any closure in flight.
    pub fn next_lease_end(&self) -> Option<u64> {
        self.data
            .queues
            .values()
            .flat_map(|q| q.running.values())
            .min()
            .copied()
    }
}
