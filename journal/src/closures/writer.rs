//! The closure-queue commands, applied: each acts on the one queue it
//! names and on that queue's closures.

use super::queue::Q;

use super::*;

/// Applies closure-queue commands.
pub(super) struct Writer<'d, 'c, 'x> {
    pub(super) queues: &'d mut BTreeMap<String, Queue>,
    pub(super) closures: &'d mut BTreeMap<u64, Closure>,
    pub(super) next_closure_id: &'d mut u64,
    pub(super) cx: &'c mut Context<'x>,
}

impl Writer<'_, '_, '_> {
    pub(super) fn queue(&mut self, name: &str) -> Result<Q<'_>, pb::DomainError> {
        match self.queues.get_mut(name) {
            Some(q) => Ok(Q {
                q,
                closures: self.closures,
                at_ms: self.cx.at_ms,
            }),
            None => Err(errors::queue_not_found(name)),
        }
    }

    pub(super) fn create_queue(
        &mut self,
        c: &pb::closures::CreateQueue,
    ) -> Result<Outcome, pb::DomainError> {
        if !valid_name(&c.queue) {
            return Err(errors::bad_queue_name(&c.queue, MAX_QUEUE_NAME_BYTES));
        }
        let wanted = c.config.as_ref().map(effective_config);
        if let Some(q) = self.queues.get(&c.queue) {
            if let Some(w) = wanted {
                let have = q.config();
                for (what, a, b) in [
                    ("max_queued", w.max_queued, have.max_queued),
                    ("max_closures", w.max_closures, have.max_closures),
                    (
                        "max_payload_bytes",
                        w.max_payload_bytes,
                        have.max_payload_bytes,
                    ),
                    (
                        "max_result_bytes",
                        w.max_result_bytes,
                        have.max_result_bytes,
                    ),
                    ("lease_ms", w.lease_ms, have.lease_ms),
                ] {
                    if a != b {
                        return Err(errors::config_conflict(
                            &c.queue,
                            &format!("{what} ({b}, not {a})"),
                        ));
                    }
                }
            }
            return Ok(Outcome::ok());
        }
        self.queues.insert(
            c.queue.clone(),
            Queue {
                name: c.queue.clone(),
                config: Some(wanted.unwrap_or_else(|| effective_config(&QueueConfig::default()))),
                ..Default::default()
            },
        );
        Ok(Outcome::ok())
    }

    pub(super) fn put(&mut self, c: &pb::closures::Put) -> Result<Outcome, pb::DomainError> {
        let first = *self.next_closure_id + 1;
        let call_id = self.cx.next_call_id();
        let mut q = self.queue(&c.queue)?;
        let config = q.q.config();
        let payloads = || std::iter::once(&c.payload).chain(&c.more_payloads);
        if let Some(p) = payloads().find(|p| p.len() as u64 > config.max_payload_bytes) {
            return Err(errors::payload_too_large(p.len(), config.max_payload_bytes));
        }
        let n = 1 + c.more_payloads.len() as u64;
        if q.q.closures.saturating_add(n) > config.max_closures {
            return Err(errors::too_many_closures(&c.queue, config.max_closures));
        }
        q.q.closures += n;
        // Upstream puts, then raises: the closures are cancelled with the
        // rest, the error raised and cleared.
        let raised = q.q.error.take();
        let mut parked = false;
        for (id, payload) in (first..).zip(payloads()) {
            q.closures.insert(
                id,
                Closure {
                    id,
                    queue: c.queue.clone(),
                    payload: payload.clone(),
                    tag: c.tag.clone(),
                    ..Default::default()
                },
            );
            if raised.is_some() {
                q.closure(id).set_state(ClosureState::Cancelled);
            } else if q.q.queued.len() as u64 >= config.max_queued {
                let order = q.next_order();
                let cl = q.closure(id);
                cl.set_state(ClosureState::Pending);
                cl.order = order;
                q.q.pending.insert(order, id);
                parked = true;
            } else {
                q.enqueue(id);
            }
            q.settle();
        }
        *self.next_closure_id = first + n - 1;
        let mut reply = Reply::of(reply::Reply::ClosureId(first));
        reply.raised = raised;
        let mut out = answer(reply);
        if parked {
            out.parked = true;
            out.call_id = call_id;
        }
        Ok(out)
    }

    pub(super) fn get(&mut self, c: &pb::closures::Get) -> Result<Outcome, pb::DomainError> {
        if c.worker.is_empty() {
            return Err(errors::no_worker());
        }
        let call_id = self.cx.next_call_id();
        let mut q = self.queue(&c.queue)?;
        q.settle();
        if let Some(a) = q.hand_out(&c.worker) {
            q.settle();
            let mut reply = Reply::of(reply::Reply::Assigned(a));
            for _ in 1..c.max_closures.max(1) {
                let Some(a) = q.hand_out(&c.worker) else {
                    break;
                };
                reply.more_assigned.push(a);
                q.settle();
            }
            return Ok(answer(reply));
        }
        q.q.get_waiters.push(GetWaiter {
            call_id,
            worker: c.worker.clone(),
            deadline_ms: c.deadline_ms,
        });
        Ok(Outcome::parked(call_id))
    }

    pub(super) fn renew(&mut self, c: &pb::closures::Renew) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        let until = q.at_ms.saturating_add(q.q.config().lease_ms);
        let mut renewed = 0;
        let ids: Vec<u64> = q.q.running.keys().copied().collect();
        for id in ids {
            if q.closures.get(&id).is_some_and(|cl| cl.worker == c.worker) {
                q.closure(id).lease_expires_ms = until;
                q.q.running.insert(id, until);
                renewed += 1;
            }
        }
        Ok(answer(Reply::of(reply::Reply::Renewed(renewed))))
    }

    pub(super) fn finish(&mut self, c: &pb::closures::Finish) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        let first = finish(&mut q, c.closure_id, &c.worker, &c.result);
        let mut reply = Reply::of(reply::Reply::Accepted(first));
        reply.more_accepted = c
            .more
            .iter()
            .map(|r| finish(&mut q, r.closure_id, &c.worker, &r.result))
            .collect();
        Ok(answer(reply))
    }

    pub(super) fn fail(&mut self, c: &pb::closures::Fail) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        if !q.settleable(c.closure_id) {
            return Ok(answer(Reply::of(reply::Reply::Accepted(false))));
        }
        let mut e = c.error.clone().unwrap_or_default();
        if e.code == Code::Ok as i32 {
            e.code = Code::Unknown as i32;
        }
        Ok(fail(&mut q, c.closure_id, &c.worker, e))
    }

    pub(super) fn put_back(
        &mut self,
        c: &pb::closures::PutBack,
    ) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        let held = q.closures.get(&c.closure_id).is_some_and(|cl| {
            cl.queue == c.queue && cl.state() == ClosureState::Running && cl.worker == c.worker
        });
        if held {
            q.unlink(c.closure_id);
            q.enqueue(c.closure_id);
            q.settle();
        }
        Ok(answer(Reply::of(reply::Reply::Accepted(held))))
    }

    pub(super) fn expire_leases(
        &mut self,
        c: &pb::closures::ExpireLeases,
    ) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        let at = q.at_ms;
        let mut expired = 0;
        for &id in &c.closure_ids {
            if q.q.running.get(&id).is_some_and(|until| *until <= at) {
                q.unlink(id);
                q.enqueue(id);
                expired += 1;
            }
        }
        q.settle();
        Ok(answer(Reply::of(reply::Reply::Renewed(expired))))
    }

    pub(super) fn done(&mut self, c: &pb::closures::Done) -> Result<Outcome, pb::DomainError> {
        let q = self.queue(&c.queue)?;
        if let Some(e) = q.q.error.take() {
            return Ok(answer(Reply {
                raised: Some(e),
                ..Default::default()
            }));
        }
        Ok(answer(Reply::of(reply::Reply::Idle(q.q.is_idle()))))
    }

    pub(super) fn release(
        &mut self,
        c: &pb::closures::Release,
    ) -> Result<Outcome, pb::DomainError> {
        let q = self.queue(&c.queue)?;
        let mut released = 0;
        for id in &c.closure_ids {
            let drop = q
                .closures
                .get(id)
                .is_some_and(|cl| cl.queue == c.queue && cl.is_settled());
            if drop {
                q.closures.remove(id);
                q.q.closures -= 1;
                released += 1;
            }
        }
        Ok(answer(Reply::of(reply::Reply::Released(released))))
    }
}

/// `mark_finished` of one closure: whether it was accepted (a result over
/// the limit fails the closure instead).
pub(super) fn finish(q: &mut Q<'_>, id: u64, worker: &str, result: &Bytes) -> bool {
    if !q.settleable(id) {
        return false;
    }
    let limit = q.q.config().max_result_bytes;
    if result.len() as u64 > limit {
        let (code, message) = errors::result_too_large(result.len(), limit);
        let e = ClosureError {
            code: code as i32,
            message,
            ..Default::default()
        };
        fail(q, id, worker, e);
        return true;
    }
    q.unlink(id);
    let cl = q.closure(id);
    cl.set_state(ClosureState::Finished);
    cl.result = result.clone();
    cl.worker = worker.to_string();
    cl.lease_expires_ms = 0;
    q.settle();
    true
}

/// Fails a settleable closure with `e` (the queue's first error if none is
/// pending).
pub(super) fn fail(q: &mut Q<'_>, id: u64, worker: &str, mut e: ClosureError) -> Outcome {
    e.closure_id = id;
    q.unlink(id);
    let cl = q.closure(id);
    cl.set_state(ClosureState::Failed);
    cl.error = Some(e.clone());
    cl.worker = worker.to_string();
    cl.lease_expires_ms = 0;
    q.first_error(e);
    q.settle();
    answer(Reply::of(reply::Reply::Accepted(true)))
}
