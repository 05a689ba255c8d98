//! The rendezvous area's semantics: torch 2.15's dynamic rendezvous ops
//! (its join, exit and close ops and the completion by last call) as the
//! state decides them, one test per case of torch's own op tests that a
//! state machine can run, then what coordstore adds (the epoch agents wait
//! on, the leader's Complete and Expire, bounds, levels).

mod common;

use journal::pb::rendezvous::{self as r, Node, Place, Settings, View};
use journal::pb::{outcome, Code, Update};
use journal::rendezvous::MAX_NODES;
use journal::{Answer, Outcome, State, Wait};

const RUN: &str = "job42";

struct T {
    s: State,
    now: u64,
    settings: Settings,
}

fn node(addr: &str, pid: u64) -> Node {
    Node {
        addr: addr.into(),
        pid,
        local_id: 0,
    }
}

impl T {
    /// A run of `min` to `max` agents, a 30 s last call, 15 s liveness.
    fn new(min: u32, max: u32) -> T {
        T {
            s: common::new_state(1, &common::Opts::default()),
            now: 1_000_000,
            settings: Settings {
                min_nodes: min,
                max_nodes: max,
                last_call_ms: 30_000,
                liveness_ms: 15_000,
            },
        }
    }

    fn apply(&mut self, c: impl Into<Update>) -> Outcome {
        let mut u: Update = c.into();
        u.at_ms = self.now;
        let out = self.s.apply(&u);
        self.s.check_invariants().expect("invariants hold");
        out
    }

    fn view_of(out: Outcome) -> View {
        assert!(!out.is_err(), "{out:?}");
        match out.reply {
            Some(outcome::Reply::Rendezvous(r)) => r.view.expect("a view"),
            other => panic!("not a rendezvous reply: {other:?}"),
        }
    }

    fn join(&mut self, n: &Node) -> View {
        let j = r::Join {
            run: RUN.into(),
            node: Some(n.clone()),
            settings: Some(self.settings),
        };
        T::view_of(self.apply(j))
    }

    fn leave(&mut self, n: &Node) -> View {
        let l = r::Leave {
            run: RUN.into(),
            node: Some(n.clone()),
        };
        T::view_of(self.apply(l))
    }

    fn complete(&mut self, round: u64) {
        let out = self.apply(r::Complete {
            run: RUN.into(),
            round,
        });
        assert!(!out.is_err(), "{out:?}");
    }

    fn view(&self, n: &Node) -> View {
        let ns = self.s.namespace("").expect("the default namespace");
        ns.rendezvous().view(RUN, n)
    }

    fn run(&self) -> r::Run {
        let ns = self.s.namespace("").expect("the default namespace");
        ns.rendezvous().run(RUN).cloned().expect("the run")
    }
}

#[test]
fn the_first_joins_take_part_and_the_last_call_starts_at_min_nodes() {
    let mut t = T::new(2, 3);
    let (a, b) = (node("10.0.0.1", 1), node("10.0.0.2", 1));
    let v = t.join(&a);
    assert_eq!(v.place(), Place::Participant);
    assert!(!v.complete);
    assert_eq!(t.run().last_call_ends_ms, 0, "one of two: no last call yet");
    t.now += 5;
    t.join(&b);
    assert_eq!(t.run().last_call_ends_ms, t.now + 30_000);
    // Not formed until the last call passed, and only by the leader's word.
    t.complete(0);
    assert!(!t.run().complete, "the last call has not passed");
    t.now += 30_000;
    t.complete(1);
    assert!(!t.run().complete, "another round's completion does nothing");
    t.complete(0);
    let (va, vb) = (t.view(&a), t.view(&b));
    assert!(va.complete && vb.complete);
    assert_eq!((va.rank, vb.rank, va.world_size), (0, 1, 2));
    assert_eq!(t.run().last_call_ends_ms, 0);
}

#[test]
fn a_round_forms_at_once_at_max_nodes_with_ranks_in_torchs_order() {
    let mut t = T::new(1, 3);
    // torch orders node descriptors by (address, pid, local id): the pid
    // as a number, not as text.
    let (a, b, c) = (
        node("10.0.0.2", 9),
        node("10.0.0.2", 10),
        node("10.0.0.1", 500),
    );
    t.join(&a);
    t.join(&b);
    let epoch = t.run().epoch;
    let v = t.join(&c);
    assert!(v.complete);
    assert_eq!(t.run().epoch, epoch + 1, "forming moves the epoch");
    assert_eq!(
        [t.view(&c).rank, t.view(&a).rank, t.view(&b).rank],
        [0, 1, 2]
    );
    assert_eq!(v.world_size, 3);
}

#[test]
fn joins_into_a_round_being_formed_do_not_wake_anyone() {
    // N agents joining must not wake N waiters N times: the epoch moves
    // only when a waiting agent may act.
    let mut t = T::new(4, 4);
    let nodes: Vec<Node> = (0..3).map(|i| node("h", i)).collect();
    for n in &nodes {
        t.join(n);
    }
    assert_eq!(t.run().epoch, 0);
}

#[test]
fn a_participant_of_a_formed_round_is_done_and_a_rejoin_changes_nothing() {
    let mut t = T::new(1, 2);
    let (a, b) = (node("a", 1), node("b", 1));
    t.join(&a);
    t.join(&b);
    let before = t.run();
    let v = t.join(&a);
    assert!(v.complete && v.place() == Place::Participant);
    assert_eq!(t.run(), before);
}

#[test]
fn a_late_agent_waits_while_there_is_room_and_is_redundant_when_full() {
    let mut t = T::new(1, 2);
    let (a, b, c) = (node("a", 1), node("b", 1), node("c", 1));
    t.join(&a);
    t.now += 30_000;
    t.complete(0);
    // Formed with one of two: room for b.
    assert_eq!(t.join(&b).place(), Place::Waiting);
    assert_eq!(t.view(&a).waiting, 1, "torch's num_nodes_waiting");
    // Joining again while waiting changes nothing.
    assert_eq!(t.join(&b).place(), Place::Waiting);
    let mut full = T::new(1, 1);
    full.join(&a);
    assert_eq!(full.join(&c).place(), Place::Redundant);
    assert_eq!(full.view(&a).waiting, 0, "the redundant are not waiting");
}

#[test]
fn a_redundant_agent_stays_while_full_and_moves_on_when_there_is_room() {
    let mut t = T::new(1, 1);
    let (a, b) = (node("a", 1), node("b", 1));
    t.join(&a);
    assert_eq!(t.join(&b).place(), Place::Redundant);
    assert_eq!(t.join(&b).place(), Place::Redundant);
    // a leaves: the last participant out moves the run to round 1, and b's
    // next join takes part in it.
    let epoch = t.run().epoch;
    t.leave(&a);
    assert_eq!(t.run().epoch, epoch + 1);
    assert_eq!(t.run().round, 1);
    let v = t.join(&b);
    assert_eq!(
        (v.place(), v.round, v.complete),
        (Place::Participant, 1, true)
    );
}

#[test]
fn the_wait_list_joins_the_next_round_once_every_participant_left() {
    // torch's scale-up: healthy agents see num_nodes_waiting > 0, each
    // runs its exit op then its join op.
    let mut t = T::new(1, 3);
    let (a, b, c) = (node("a", 1), node("b", 1), node("c", 1));
    t.join(&a);
    t.join(&b);
    t.now += 30_000;
    t.complete(0);
    assert_eq!(t.join(&c).place(), Place::Waiting);
    t.leave(&a);
    assert_eq!(t.run().round, 0, "b still takes part");
    assert_eq!(
        t.join(&a).place(),
        Place::Waiting,
        "a formed round takes no one"
    );
    t.leave(&b);
    assert_eq!((t.run().round, t.run().complete), (1, false));
    for n in [&c, &a, &b] {
        assert_eq!(t.join(n).place(), Place::Participant);
    }
    assert!(t.view(&a).complete, "three of three formed round 1");
    assert_eq!(t.run().wait_list, vec![]);
}

#[test]
fn leaving_below_min_nodes_ends_the_last_call() {
    let mut t = T::new(2, 4);
    let (a, b) = (node("a", 1), node("b", 1));
    t.join(&a);
    t.join(&b);
    assert_ne!(t.run().last_call_ends_ms, 0);
    t.leave(&b);
    assert_eq!(t.run().last_call_ends_ms, 0);
    t.now += 60_000;
    t.complete(0);
    assert!(!t.run().complete, "one agent is below min_nodes");
    // Back to two: a new last call from now.
    t.join(&b);
    assert_eq!(t.run().last_call_ends_ms, t.now + 30_000);
}

#[test]
fn leaving_from_a_list_or_a_run_never_joined_changes_nothing_else() {
    let mut t = T::new(1, 2);
    let (a, b, z) = (node("a", 1), node("b", 1), node("z", 1));
    assert!(!t.leave(&a).exists, "no run yet");
    t.join(&a);
    t.now += 30_000;
    t.complete(0);
    t.join(&b);
    let v = t.leave(&b);
    assert_eq!(v.place(), Place::None);
    assert_eq!(t.view(&a).waiting, 0);
    let before = t.run();
    t.leave(&z);
    assert_eq!(t.run(), before);
}

#[test]
fn a_closed_run_takes_no_one_and_says_so() {
    let mut t = T::new(1, 1);
    let (a, b) = (node("a", 1), node("b", 1));
    t.join(&a);
    assert_eq!(t.join(&b).place(), Place::Redundant);
    let epoch = t.run().epoch;
    t.apply(r::Close { run: RUN.into() });
    assert_eq!(t.run().epoch, epoch + 1, "closing wakes every waiter");
    let v = t.join(&node("c", 1));
    assert!(v.closed);
    assert_eq!(v.place(), Place::None, "nobody joins a closed run");
    // The redundant agent reads closed and its place: torch's graceful exit.
    let v = t.join(&b);
    assert!(v.closed && v.place() == Place::Redundant);
    // Closing twice is closing once.
    t.apply(r::Close { run: RUN.into() });
    assert_eq!(t.run().epoch, epoch + 1);
}

#[test]
fn the_leader_drops_silent_agents_with_torchs_epilogue() {
    let mut t = T::new(1, 2);
    let (a, b, c) = (node("a", 1), node("b", 1), node("c", 1));
    t.join(&a);
    t.join(&b);
    assert!(t.run().complete);
    t.join(&c);
    let epoch = t.run().epoch;
    t.apply(r::Expire {
        run: RUN.into(),
        nodes: vec![b.clone(), c.clone()],
    });
    let run = t.run();
    assert_eq!(run.participants, vec![a.clone()]);
    assert!(run.redundancy_list.is_empty());
    assert_eq!(run.epoch, epoch + 1);
    t.apply(r::Expire {
        run: RUN.into(),
        nodes: vec![a.clone()],
    });
    assert_eq!((t.run().round, t.run().complete), (1, false));
    // Dropping agents no longer there moves nothing.
    let epoch = t.run().epoch;
    t.apply(r::Expire {
        run: RUN.into(),
        nodes: vec![a],
    });
    assert_eq!(t.run().epoch, epoch);
}

#[test]
fn an_agent_waits_on_the_runs_epoch() {
    let mut t = T::new(2, 2);
    let a = node("a", 1);
    let v = t.join(&a);
    let mut wait = Wait::Rendezvous {
        run: RUN.into(),
        epoch: v.epoch,
    };
    assert_eq!(t.s.wait_result("", None, &mut wait), None);
    t.join(&node("b", 1));
    assert_eq!(t.s.wait_result("", None, &mut wait), Some(Ok(Answer::Done)));
    // A run a job epoch reset took away answers too.
    let mut gone = Wait::Rendezvous {
        run: "other".into(),
        epoch: 0,
    };
    assert_eq!(t.s.wait_result("", None, &mut gone), Some(Ok(Answer::Done)));
}

#[test]
fn bad_joins_are_refused_with_the_reason() {
    let mut t = T::new(2, 3);
    let refused = |t: &mut T, j: r::Join| t.apply(j).error.expect("refused");
    let good = r::Join {
        run: RUN.into(),
        node: Some(node("a", 1)),
        settings: Some(t.settings),
    };
    let mut no_run = good.clone();
    no_run.run.clear();
    assert_eq!(refused(&mut t, no_run).code(), Code::InvalidArgument);
    let mut no_addr = good.clone();
    no_addr.node = Some(node("", 1));
    assert_eq!(refused(&mut t, no_addr).code(), Code::InvalidArgument);
    for (min, max) in [(0, 1), (3, 2), (1, MAX_NODES + 1)] {
        let mut bad = good.clone();
        bad.settings = Some(Settings {
            min_nodes: min,
            max_nodes: max,
            ..t.settings
        });
        assert_eq!(
            refused(&mut t, bad).code(),
            Code::InvalidArgument,
            "{min}..{max}"
        );
    }
    assert!(t.s.namespace("").unwrap().rendezvous().run(RUN).is_none());
    t.join(&node("a", 1));
    let mut other = good;
    other.node = Some(node("b", 1));
    other.settings = Some(Settings {
        max_nodes: 4,
        ..t.settings
    });
    let e = refused(&mut t, other);
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message.contains("takes 2 to 3 agents"), "{}", e.message);
    assert_eq!(t.run().participants.len(), 1, "nothing half-applied");
}

#[test]
fn the_leaders_commands_are_not_a_clients_and_everything_needs_level_5() {
    let complete: Update = r::Complete {
        run: RUN.into(),
        round: 0,
    }
    .into();
    let expire: Update = r::Expire {
        run: RUN.into(),
        nodes: vec![],
    }
    .into();
    let join: Update = r::Join::default().into();
    let cmd = |u: &Update| u.command.clone().expect("a command");
    assert!(!journal::client_proposable(&cmd(&complete)));
    assert!(!journal::client_proposable(&cmd(&expire)));
    assert!(journal::client_proposable(&cmd(&join)));
    for u in [complete, expire, join] {
        assert_eq!(u.required_level(), journal::LEVEL_RENDEZVOUS);
    }
    let mut t = T::new(1, 1);
    t.join(&node("a", 1));
    assert!(t.s.feature_level() >= journal::LEVEL_RENDEZVOUS);
}

#[test]
fn a_job_epoch_reset_ends_every_run() {
    let mut t = T::new(1, 1);
    t.join(&node("a", 1));
    t.apply(Update::from(journal::pb::update::Command::ResetJobEpoch(
        journal::pb::ResetJobEpoch {
            config: None,
            service_incarnation: 7,
        },
    )));
    assert!(t.s.namespace("").unwrap().rendezvous().run(RUN).is_none());
}

#[test]
fn random_ops_keep_every_rule() {
    // A small deterministic walk over joins, leaves, completions and drops
    // of six agents: every apply checks the area's invariants.
    let nodes: Vec<Node> = (0..6).map(|i| node(&format!("h{}", i % 3), i)).collect();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut t = T::new(2, 4);
    for _ in 0..5_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let n = &nodes[(seed % 6) as usize];
        match (seed >> 8) % 5 {
            0 | 1 => {
                t.join(n);
            }
            2 => {
                t.leave(n);
            }
            3 => {
                t.now += 10_000;
                let round = t.run().round;
                t.complete(round);
            }
            _ => {
                t.apply(r::Expire {
                    run: RUN.into(),
                    nodes: vec![n.clone()],
                });
            }
        }
        let run = t.run();
        if run.complete {
            assert!(!run.participants.is_empty() || run.round > 0);
        }
    }
}
