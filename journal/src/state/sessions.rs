//! Exactly-once sessions: the outcome each client's updates got, kept until
//! the client declares them done or is forgotten, and the recency index
//! that picks which client to forget.

use super::*;

impl State {
    pub(super) fn limits(&self) -> (usize, usize) {
        let c = self.data.config.as_ref();
        let sessions = c.map_or(0, |c| c.max_client_sessions);
        let outcomes = c.map_or(0, |c| c.max_outcomes_per_client);
        let or_default = |v: u32, d: u32| if v == 0 { d } else { v } as usize;
        (
            or_default(sessions, DEFAULT_MAX_CLIENT_SESSIONS),
            or_default(outcomes, DEFAULT_MAX_OUTCOMES_PER_CLIENT),
        )
    }

    pub(super) fn session_horizon_ms(&self) -> u64 {
        match self
            .data
            .config
            .as_ref()
            .map_or(0, |c| c.session_horizon_ms)
        {
            0 => DEFAULT_SESSION_HORIZON_MS,
            h => h,
        }
    }

    /// The recorded outcome of a retried update, or the refusal of a late
    /// copy of one its client has declared done; `None` for a new update.
    ///
    /// How long an outcome is kept does not depend on anyone else's traffic:
    /// until its client declares it done (`done_below`; coordstore's nodes,
    /// relay and agent do, and keep one call per client id in flight, so they
    /// hold one outcome each), or until the client has not been heard of for
    /// the session horizon (leader clock). Two bounds remain for clients that
    /// never declare anything done: a client keeps its newest
    /// `max_outcomes_per_client` outcomes (a retry older than that is applied
    /// again: refusing it would fail a call that may never have been
    /// applied), and the table keeps the `max_client_sessions` most recently
    /// heard of clients.
    pub(super) fn recorded_outcome(&mut self, o: &Origin) -> Option<Outcome> {
        let (applied, now) = (self.data.applied, self.data.clock_ms);
        let s = self.data.sessions.entry(o.client_id).or_default();
        self.session_lru.remove(&(s.touched, o.client_id));
        self.session_lru.insert((applied, o.client_id));
        s.touched = applied;
        s.touched_ms = now;
        // A request cannot declare itself done.
        let done_below = o.done_below.min(o.seq);
        if done_below > s.done_below {
            s.done_below = done_below;
            s.outcomes = s.outcomes.split_off(&done_below);
        }
        if let Some(out) = s.outcomes.get(&o.seq) {
            return Some(out.clone());
        }
        if o.seq < s.done_below {
            return Some(Outcome::err(errors::late_copy(o.client_id, o.seq)));
        }
        None
    }

    pub(super) fn record_outcome(&mut self, o: &Origin, out: &Outcome) {
        let (max_sessions, max_outcomes) = self.limits();
        let s = self.data.sessions.entry(o.client_id).or_default();
        s.outcomes.insert(o.seq, out.clone());
        while s.outcomes.len() > max_outcomes {
            s.outcomes.pop_first();
        }
        while self.data.sessions.len() > max_sessions {
            // Evict the least recently used client (deterministic: ties by id).
            match self.session_lru.pop_first() {
                Some((_, id)) => {
                    self.data.sessions.remove(&id);
                }
                None => break,
            }
        }
    }

    /// Forgets every client not heard of for the session horizon.
    pub(super) fn expire_sessions(&mut self) {
        let horizon = self.session_horizon_ms();
        let Some(cutoff) = self.data.clock_ms.checked_sub(horizon) else {
            return;
        };
        let lru = &mut self.session_lru;
        self.data.sessions.retain(|id, s| {
            let keep = s.touched_ms >= cutoff;
            if !keep {
                lru.remove(&(s.touched, *id));
            }
            keep
        });
    }

    /// Number of clients the exactly-once table remembers.
    pub fn session_count(&self) -> usize {
        self.data.sessions.len()
    }

    /// Number of outcomes the exactly-once table holds, over all clients.
    pub fn outcomes_held(&self) -> usize {
        self.data.sessions.values().map(|s| s.outcomes.len()).sum()
    }
}

/// The recency index of `sessions`: (last touched, client id) of each.
pub(super) fn session_lru(sessions: &BTreeMap<u64, ClientSession>) -> BTreeSet<(u64, u64)> {
    sessions.iter().map(|(id, s)| (s.touched, *id)).collect()
}
