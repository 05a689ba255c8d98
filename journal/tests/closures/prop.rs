//! Any sequence of closure-queue commands keeps the queue's invariants (the
//! snapshot checks pass after every step: every closure is in exactly the
//! set its state names, counts match), never changes a settled closure's
//! outcome, and never loses a closure: each is settled or still pending,
//! queued or in flight.

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
enum Op {
    Put(u8),
    PutMany(u8, u8),
    Get(u8, bool),
    GetMany(u8, u8),
    Finish(u8, u8, u8),
    FinishMany(Vec<(u8, u8)>, u8),
    Fail(u8, u8),
    PutBack(u8, u8),
    Expire(u8),
    Renew(u8),
    Join,
    Done,
    Release(u8),
    Tick(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<u8>().prop_map(Op::Put),
        1 => (any::<u8>(), 0u8..8).prop_map(|(n, k)| Op::PutMany(n, k)),
        3 => (0u8..4, any::<bool>()).prop_map(|(w, d)| Op::Get(w, d)),
        1 => (0u8..4, 0u8..6).prop_map(|(w, k)| Op::GetMany(w, k)),
        2 => (0u8..32, 0u8..4, 0u8..80).prop_map(|(c, w, n)| Op::Finish(c, w, n)),
        1 => (proptest::collection::vec((0u8..32, 0u8..80), 1..5), 0u8..4)
            .prop_map(|(cs, w)| Op::FinishMany(cs, w)),
        1 => (0u8..32, 0u8..4).prop_map(|(c, w)| Op::Fail(c, w)),
        1 => (0u8..32, 0u8..4).prop_map(|(c, w)| Op::PutBack(c, w)),
        1 => (0u8..32).prop_map(Op::Expire),
        1 => (0u8..4).prop_map(Op::Renew),
        1 => Just(Op::Join),
        1 => Just(Op::Done),
        1 => (0u8..32).prop_map(Op::Release),
        2 => (0u16..1500).prop_map(Op::Tick),
    ]
}

fn worker(w: u8) -> String {
    format!("w{w}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn any_sequence_keeps_every_closure_accounted_for(ops in proptest::collection::vec(op(), 1..120)) {
        let mut t = T::new(4);
        let mut settled: std::collections::BTreeMap<u64, Closure> = Default::default();
        let mut put = 0u64;
        for o in ops {
            match o {
                Op::Put(n) => {
                    let out = t.put(&n.to_string());
                    if !out.is_err() {
                        put += 1;
                    }
                }
                Op::PutMany(n, k) => {
                    let out = t.put_many(&n.to_string(), usize::from(k) + 1);
                    if !out.is_err() {
                        put += u64::from(k) + 1;
                    }
                }
                Op::GetMany(w, k) => {
                    t.run(c::Get {
                        queue: Q.into(),
                        worker: worker(w),
                        max_closures: k.into(),
                        ..Default::default()
                    });
                }
                Op::FinishMany(cs, w) => {
                    let results: Vec<(u64, String)> = cs
                        .iter()
                        .map(|&(c, n)| (u64::from(c), "r".repeat(n.into())))
                        .collect();
                    t.finish_many(&worker(w), &results);
                }
                Op::Get(w, d) => {
                    let deadline = if d { t.now + 500 } else { 0 };
                    t.get(&worker(w), deadline);
                }
                Op::Finish(c, w, n) => {
                    t.finish(u64::from(c), &worker(w), &"r".repeat(n.into()));
                }
                Op::Fail(c, w) => {
                    t.fail(u64::from(c), &worker(w), "boom");
                }
                Op::PutBack(c, w) => {
                    t.put_back(u64::from(c), &worker(w));
                }
                Op::Expire(c) => {
                    t.run(c::ExpireLeases { queue: Q.into(), closure_ids: vec![u64::from(c)] });
                }
                Op::Renew(w) => {
                    t.run(c::Renew { queue: Q.into(), worker: worker(w) });
                }
                Op::Join => {
                    let ready = common::join_ready(&t.s, Q);
                    let out = t.done();
                    let idle = reply(&out).reply == Some(R::Idle(true));
                    prop_assert_eq!(ready, idle || raised(&out).is_some());
                }
                Op::Done => {
                    t.done();
                }
                Op::Release(c) => {
                    let id = u64::from(c);
                    if t.run(c::Release { queue: Q.into(), closure_ids: vec![id] }).reply.is_some() {
                        settled.remove(&id);
                    }
                }
                Op::Tick(ms) => t.now += u64::from(ms),
            }
            prop_assert_eq!(t.s.check_invariants(), Ok(()));
            let q = t.queue().clone();
            let mut live = 0u64;
            for c in t.s.closures().list(Q, "", 0, 0) {
                if c.is_settled() {
                    if let Some(before) = settled.get(&c.id) {
                        prop_assert_eq!(before, c, "a settled closure changed");
                    }
                    settled.insert(c.id, c.clone());
                } else {
                    live += 1;
                }
            }
            prop_assert_eq!(live, (q.pending.len() + q.queued.len() + q.running.len()) as u64);
            prop_assert!(q.closures <= put);
            // A closure waits as pending only while the queue is full.
            prop_assert!(q.pending.is_empty() || q.queued.len() as u64 >= 4);
            // A waiting get never coexists with a queued closure.
            prop_assert!(q.get_waiters.is_empty() || q.queued.is_empty());
        }
    }
}
