//! One queue's mechanics: closures enqueued in order, handed out under a
//! lease, settled, the first error that cancels what is in flight.

use super::*;

/// One queue and the closures, borrowed apart.
pub(super) struct Q<'d> {
    pub(super) q: &'d mut Queue,
    pub(super) closures: &'d mut BTreeMap<u64, Closure>,
    pub(super) at_ms: u64,
}

impl Q<'_> {
    pub(super) fn closure(&mut self, id: u64) -> &mut Closure {
        self.closures
            .get_mut(&id)
            .expect("a queue names only closures it holds")
    }

    pub(super) fn next_order(&mut self) -> u64 {
        self.q.next_order += 1;
        self.q.next_order
    }

    pub(super) fn enqueue(&mut self, id: u64) {
        let order = self.next_order();
        let c = self.closure(id);
        c.set_state(ClosureState::Queued);
        c.order = order;
        c.worker.clear();
        c.lease_expires_ms = 0;
        self.q.queued.insert(order, id);
    }

    /// Takes the closure out of the queue's pending, queued or running set.
    pub(super) fn unlink(&mut self, id: u64) {
        let (state, order) = {
            let c = self.closure(id);
            (c.state(), c.order)
        };
        match state {
            ClosureState::Pending => {
                self.q.pending.remove(&order);
            }
            ClosureState::Queued => {
                self.q.queued.remove(&order);
            }
            ClosureState::Running => {
                self.q.running.remove(&id);
            }
            _ => {}
        }
    }

    /// Hands the oldest queued closure to `worker`.
    pub(super) fn hand_out(&mut self, worker: &str) -> Option<Assigned> {
        let (_, id) = self.q.queued.pop_first()?;
        let until = self.at_ms.saturating_add(self.q.config().lease_ms);
        let c = self.closure(id);
        c.set_state(ClosureState::Running);
        c.worker = worker.to_string();
        c.lease_expires_ms = until;
        c.attempts += 1;
        let a = Assigned {
            closure_id: id,
            payload: c.payload.clone(),
            attempt: c.attempts,
            tag: c.tag.clone(),
            lease_expires_ms: until,
        };
        self.q.running.insert(id, until);
        Some(a)
    }

    pub(super) fn push_answer(&mut self, a: Answer) {
        self.q.answers.push(a);
        let over = self.q.answers.len().saturating_sub(MAX_ANSWERS);
        if over > 0 {
            self.q.answers.drain(..over);
        }
    }

    /// Restores the queue's invariants after a change: pending closures
    /// fill free slots, and queued closures go to live get waiters.
    pub(super) fn settle(&mut self) {
        let at = self.at_ms;
        self.q
            .get_waiters
            .retain(|w| w.deadline_ms == 0 || w.deadline_ms > at);
        loop {
            let max = self.q.config().max_queued;
            while (self.q.queued.len() as u64) < max {
                let Some((_, id)) = self.q.pending.pop_first() else {
                    break;
                };
                self.enqueue(id);
            }
            if self.q.get_waiters.is_empty() || self.q.queued.is_empty() {
                break;
            }
            let w = self.q.get_waiters.remove(0);
            if let Some(a) = self.hand_out(&w.worker) {
                self.push_answer(Answer {
                    call_id: w.call_id,
                    closure_id: a.closure_id,
                });
            }
        }
    }

    /// The first error: kept until raised; everything pending, queued or in
    /// flight is cancelled (closures in flight are out of generation).
    pub(super) fn first_error(&mut self, e: ClosureError) {
        if self.q.error.is_some() {
            return;
        }
        self.q.error = Some(e);
        self.q.generation += 1;
        let ids: Vec<u64> = self
            .q
            .pending
            .values()
            .chain(self.q.queued.values())
            .copied()
            .chain(self.q.running.keys().copied())
            .collect();
        self.q.pending.clear();
        self.q.queued.clear();
        self.q.running.clear();
        for id in ids {
            let c = self.closure(id);
            c.set_state(ClosureState::Cancelled);
            c.lease_expires_ms = 0;
        }
    }

    /// Whether `id` is a closure of this queue that a finish or a failure
    /// may still settle (queued, or in flight, in this generation).
    pub(super) fn settleable(&self, id: u64) -> bool {
        self.closures.get(&id).is_some_and(|c| {
            c.queue == self.q.name
                && matches!(c.state(), ClosureState::Queued | ClosureState::Running)
        })
    }
}
