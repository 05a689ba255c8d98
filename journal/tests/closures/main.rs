//! The closure-queue area's semantics: upstream `_CoordinatedClosureQueue`'s
//! rules one test each, then what coordstore adds (leases, a closure finished
//! twice, attaching, limits, exactly-once).

#[path = "../common/mod.rs"]
mod common;

mod batch;
mod prop;
mod queue;
mod rules;

use journal::closures::{Closure, ClosureState};
use journal::pb::closures::{self as c, reply::Reply as R, Assigned, ClosureError};
use journal::pb::{outcome, Code, Origin};
use journal::{Outcome, State, Update};

pub const Q: &str = "train";
pub const LEASE: u64 = 1_000;

/// A state with queue [`Q`]: at most `max_queued` queued closures.
pub struct T {
    pub s: State,
    pub now: u64,
}

impl T {
    pub fn new(max_queued: u64) -> T {
        let mut t = T {
            s: common::new_state(1, &common::Opts::default()),
            now: 1_000_000,
        };
        let out = t.run(c::CreateQueue {
            queue: Q.into(),
            config: Some(c::QueueConfig {
                max_queued,
                lease_ms: LEASE,
                max_closures: 100,
                max_payload_bytes: 64,
                max_result_bytes: 64,
            }),
        });
        assert!(!out.is_err(), "{out:?}");
        t
    }

    pub fn run(&mut self, cmd: impl Into<Update>) -> Outcome {
        let mut u = cmd.into();
        u.at_ms = self.now;
        let out = self.s.apply(&u);
        let snapshot = self.s.encode_snapshot();
        State::decode_snapshot(&snapshot).expect("every state passes the snapshot checks");
        out
    }

    pub fn put(&mut self, payload: &str) -> Outcome {
        self.run(c::Put {
            queue: Q.into(),
            payload: payload.as_bytes().to_vec().into(),
            tag: "coord-1".into(),
            ..Default::default()
        })
    }

    /// One put of `n` closures `payload-0`, `payload-1`, ….
    pub fn put_many(&mut self, payload: &str, n: usize) -> Outcome {
        let mut all = (0..n).map(|i| format!("{payload}-{i}").into_bytes().into());
        self.run(c::Put {
            queue: Q.into(),
            payload: all.next().unwrap_or_default(),
            tag: "coord-1".into(),
            more_payloads: all.collect(),
        })
    }

    /// One finish of every `(id, result)`: whether each was accepted.
    pub fn finish_many(&mut self, worker: &str, results: &[(u64, String)]) -> Vec<bool> {
        let mut all = results.iter().map(|(id, r)| c::Result {
            closure_id: *id,
            result: r.as_bytes().to_vec().into(),
        });
        let first = all.next().expect("a result");
        let out = self.run(c::Finish {
            queue: Q.into(),
            closure_id: first.closure_id,
            worker: worker.into(),
            result: first.result,
            more: all.collect(),
        });
        std::iter::once(accepted(&out))
            .chain(reply(&out).more_accepted)
            .collect()
    }

    /// A put that is queued at once; its id.
    pub fn put_ok(&mut self, payload: &str) -> u64 {
        let out = self.put(payload);
        assert!(!out.parked && !out.is_err(), "{out:?}");
        assert_eq!(reply(&out).raised, None);
        match reply(&out).reply {
            Some(R::ClosureId(id)) => id,
            other => panic!("{other:?}"),
        }
    }

    pub fn get(&mut self, worker: &str, deadline_ms: u64) -> Outcome {
        self.run(c::Get {
            queue: Q.into(),
            worker: worker.into(),
            deadline_ms,
            ..Default::default()
        })
    }

    /// A get that is answered at once.
    pub fn get_ok(&mut self, worker: &str) -> Assigned {
        let out = self.get(worker, 0);
        match reply(&out).reply {
            Some(R::Assigned(a)) => a,
            other => panic!("{other:?} {out:?}"),
        }
    }

    pub fn finish(&mut self, id: u64, worker: &str, result: &str) -> bool {
        let out = self.run(c::Finish {
            queue: Q.into(),
            closure_id: id,
            worker: worker.into(),
            result: result.as_bytes().to_vec().into(),
            ..Default::default()
        });
        accepted(&out)
    }

    pub fn fail(&mut self, id: u64, worker: &str, message: &str) -> bool {
        let out = self.run(c::Fail {
            queue: Q.into(),
            closure_id: id,
            worker: worker.into(),
            error: Some(ClosureError {
                code: Code::InvalidArgument as i32,
                message: message.into(),
                payload: b"pickled".to_vec().into(),
                closure_id: 0,
            }),
        });
        accepted(&out)
    }

    pub fn put_back(&mut self, id: u64, worker: &str) -> bool {
        let out = self.run(c::PutBack {
            queue: Q.into(),
            closure_id: id,
            worker: worker.into(),
        });
        accepted(&out)
    }

    pub fn done(&mut self) -> Outcome {
        self.run(c::Done { queue: Q.into() })
    }

    pub fn closure(&self, id: u64) -> Closure {
        self.s.closures().closure(id).expect("closure").clone()
    }

    pub fn state_of(&self, id: u64) -> ClosureState {
        self.closure(id).state()
    }

    pub fn get_answer(&self, call_id: u64) -> Option<u64> {
        let w = journal::Wait::ClosureGet {
            queue: Q.into(),
            call: call_id,
        };
        match common::wait(&self.s, w)? {
            Ok(journal::Answer::Assigned(Some(a))) => Some(a.closure_id),
            Ok(journal::Answer::Assigned(None)) => Some(0),
            other => panic!("a closure get answered {other:?}"),
        }
    }

    pub fn queue(&self) -> &c::Queue {
        self.s.closures().queue(Q).expect("queue")
    }
}

pub fn reply(out: &Outcome) -> c::Reply {
    match &out.reply {
        Some(outcome::Reply::Closures(r)) => r.clone(),
        None => c::Reply::default(),
        other => panic!("{other:?}"),
    }
}

pub fn accepted(out: &Outcome) -> bool {
    match reply(out).reply {
        Some(R::Accepted(a)) => a,
        other => panic!("{other:?} {out:?}"),
    }
}

pub fn raised(out: &Outcome) -> Option<ClosureError> {
    reply(out).raised
}

pub fn code(out: &Outcome) -> Code {
    out.error.as_ref().map_or(Code::Ok, |e| e.status())
}

pub fn origin(client_id: u64, seq: u64) -> Option<Origin> {
    Some(Origin {
        client_id,
        seq,
        done_below: 0,
    })
}
