//! WAIT, BARRIER, CANCEL_WAIT and the STOP_WAITING each connection is owed.

use super::*;

#[test]
fn a_wait_on_present_keys_answers_at_once() {
    let mut t = T::new();
    t.set("/k", b"v");
    assert_eq!(t.wait(A, &["/k"]), ready());
    assert_eq!(t.wait(A, &[]), ready());
    // A non-empty queue counts as present.
    t.push("/q", b"x");
    assert_eq!(t.wait(A, &["/k", "/q"]), ready());
    assert_eq!(t.connection(A), None);
}

#[test]
fn a_wait_counts_only_keys_missing_when_it_arrived() {
    let mut t = T::new();
    t.set("/a", b"1");
    assert_eq!(t.wait(A, &["/a", "/b", "/c"]), parked(0));
    // Deleting a key present at arrival does not count.
    t.delete("/a");
    t.set("/b", b"1");
    assert_eq!(t.stops(A), 0);
    t.set("/c", b"1");
    assert_eq!(t.stops(A), 1);
    // Its registrations are gone: another write owes nothing.
    t.set("/c", b"2");
    assert_eq!(t.stops(A), 1);
    assert_eq!(t.connection(A).unwrap().registered, 0);
}

#[test]
fn every_write_of_a_key_wakes_its_waiters() {
    let writes: [&dyn Fn(&mut T); 5] = [
        &|t| t.set("/k", b"v"),
        &|t| {
            t.add("/k", 0).unwrap();
        },
        &|t| t.append("/k", b"v"),
        &|t| {
            t.cas("/k", b"", b"v");
        },
        // The CAS that stores nothing wakes too (torch's server does).
        &|t| {
            t.cas("/k", b"not-there", b"v");
        },
    ];
    for (i, write) in writes.iter().enumerate() {
        let mut t = T::new();
        assert_eq!(t.wait(A, &["/k"]), parked(0));
        assert_eq!(t.wait(B, &["/k"]), parked(0));
        write(&mut t);
        assert_eq!((t.stops(A), t.stops(B)), (1, 1), "write {i}");
    }
    // DELETE_KEY wakes nobody.
    let mut t = T::new();
    t.set("/k", b"v");
    t.wait(A, &["/k", "/other"]);
    t.delete("/k");
    assert_eq!(t.stops(A), 0);
}

#[test]
fn duplicate_keys_are_released_by_one_write_with_one_stop() {
    let mut t = T::new();
    assert_eq!(t.wait(A, &["/k", "/k"]), parked(0));
    t.set("/k", b"v");
    assert_eq!(t.stops(A), 1);
}

#[test]
fn a_second_wait_overwrites_the_connections_count() {
    let mut t = T::new();
    t.wait(A, &["/x"]);
    t.wait(A, &["/y"]);
    // The count is 1 (the second WAIT's): the write of x takes it to 0.
    t.set("/x", b"1");
    assert_eq!(t.stops(A), 1);
    // Then y's write takes it below zero: nothing more is owed.
    t.set("/y", b"1");
    assert_eq!(t.stops(A), 1);
}

#[test]
fn a_non_empty_queue_key_is_registered_when_another_key_is_missing() {
    let mut t = T::new();
    t.push("/q", b"x");
    assert_eq!(t.wait(A, &["/q", "/m"]), parked(0));
    t.set("/m", b"1");
    assert_eq!(t.stops(A), 0);
    t.push("/q", b"y");
    assert_eq!(t.stops(A), 1);
}

#[test]
fn a_queue_push_wakes_one_waiter_and_leaves_it_registered() {
    let mut t = T::new();
    t.wait(A, &["/q"]);
    t.wait(B, &["/q"]);
    t.push("/q", b"1");
    assert_eq!((t.stops(A), t.stops(B)), (1, 0));
    // A is still registered (its count wrapped past zero), so the next push
    // counts A down again and reaches B.
    t.push("/q", b"2");
    assert_eq!((t.stops(A), t.stops(B)), (1, 1));
    // A connection woken by a push, waiting on something else, is owed a
    // spurious stop by the next push (as with torch's server).
    let mut t = T::new();
    t.wait(C, &["/q"]);
    t.push("/q", b"1");
    t.pop("/q");
    assert_eq!(t.wait(C, &["/m"]), parked(1));
    t.push("/q", b"2");
    assert_eq!(t.stops(C), 2);
    // A write of the queue's name wakes all its waiters.
    let mut t = T::new();
    t.wait(A, &["/q"]);
    t.wait(B, &["/q"]);
    t.set("/q", b"kv");
    assert_eq!((t.stops(A), t.stops(B)), (1, 1));
}

#[test]
fn a_barrier_counts_in_ascii_and_releases_at_the_world_size() {
    let mut t = T::new();
    // A plain WAIT on the counter: the arrivals before the last wake nobody.
    assert_eq!(t.wait(C, &["/b"]), parked(0));
    assert_eq!(t.barrier(A, "/b", 3), parked(0));
    assert_eq!(t.barrier(B, "/b", 3), parked(0));
    assert_eq!(t.get("/b").unwrap(), b"2");
    assert_eq!((t.stops(A), t.stops(B), t.stops(C)), (0, 0, 0));
    // The last arrival answers at once and wakes every waiter of the key.
    assert_eq!(t.barrier(0xD, "/b", 3), ready());
    assert_eq!((t.stops(A), t.stops(B), t.stops(C)), (1, 1, 1));
    // The counter is never reset: reusing the key passes at once.
    assert_eq!(t.barrier(A, "/b", 3), parked(1).with_ready());
    assert_eq!(t.get("/b").unwrap(), b"4");
    // A world size of 0 or less passes, and still counts.
    assert_eq!(t.barrier(0xE, "/z", 0), ready());
    assert_eq!(t.get("/z").unwrap(), b"1");
    // A counter that is not a number is refused, unchanged.
    t.set("/nan", b"x");
    let out = t.run(t::Barrier {
        connection: A,
        key: "/nan".into(),
        world_size: 2,
    });
    assert_eq!(out.error.unwrap().code(), Code::InvalidArgument);
    assert_eq!(t.get("/nan").unwrap(), b"x");
}

trait WithReady {
    fn with_ready(self) -> Waited;
}

impl WithReady for Waited {
    fn with_ready(mut self) -> Waited {
        self.ready = true;
        self
    }
}

#[test]
fn one_connection_arriving_twice_counts_twice_and_is_owed_one_stop() {
    let mut t = T::new();
    t.barrier(A, "/b", 3);
    t.barrier(A, "/b", 3);
    assert_eq!(t.barrier(B, "/b", 3), ready());
    assert_eq!(t.stops(A), 1);
    // Any write of the key releases a parked arrival.
    t.barrier(C, "/b2", 5);
    t.add("/b2", 0).unwrap();
    assert_eq!(t.stops(C), 1);
}

#[test]
fn cancel_answers_what_was_owed_and_drops_every_registration() {
    let mut t = T::new();
    t.wait(A, &["/k"]);
    t.set("/k", b"v");
    // The wake came first: the cancel says one stop was owed before it.
    assert_eq!(t.cancel(A), parked(1));
    t.wait(A, &["/x", "/y"]);
    assert_eq!(t.cancel(A), parked(1));
    t.set("/x", b"1");
    t.set("/y", b"1");
    assert_eq!(t.stops(A), 1);
    assert_eq!(t.connection(A).unwrap().registered, 0);
    // A cancel with nothing pending answers too.
    assert_eq!(t.cancel(B), parked(0));
    // A barrier's count stays after its arrival's cancel.
    t.barrier(C, "/b", 2);
    t.cancel(C);
    assert_eq!(t.barrier(B, "/b", 2), ready());
}

#[test]
fn closed_and_silent_connections_are_forgotten() {
    let mut t = T::new();
    t.wait(A, &["/k"]);
    t.wait(B, &["/k"]);
    assert!(!t
        .run(t::Forget {
            connections: vec![A]
        })
        .is_err());
    assert_eq!(t.connection(A), None);
    t.set("/k", b"v");
    assert_eq!(t.stops(B), 1);
    // B said alive at 1 000 000; C registers later and is kept alive.
    t.now += 50_000;
    t.wait(C, &["/q"]);
    t.now += 20_000;
    let touch = t::Touch {
        connections: vec![C],
        horizon_ms: 60_000,
    };
    assert!(!t.run(touch).is_err());
    assert_eq!(t.connection(B), None, "silent for 70 s");
    assert!(t.connection(C).is_some());
    // A forgotten waiter no longer takes a queue push from a live one.
    t.wait(A, &["/q"]);
    assert!(!t
        .run(t::Forget {
            connections: vec![C]
        })
        .is_err());
    t.push("/q", b"x");
    assert_eq!(t.stops(A), 1);
}
