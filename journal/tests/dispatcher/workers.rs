//! Workers: registration, their tasks, heartbeats that change nothing.

use crate::common::ok;
use crate::*;

#[test]
fn a_new_worker_gets_a_task_of_every_running_iteration() {
    let mut s = state();
    let ds = register(&mut s, "g", "m");
    let j = new_job(&mut s, &ds, None);
    let (_, it, _) = iterate(&mut s, j, 1);
    assert!(s.dispatcher().iteration(it).unwrap().tasks.is_empty());
    let out = run(&mut s, worker("late:1"), 1);
    assert_eq!(out.worker_tasks(), Some(&[4000][..]));
    assert_eq!(s.dispatcher().iteration(it).unwrap().tasks, vec![4000]);
    let mut rr = job(&ds, Some("rr"), 1);
    rr.num_consumers = Some(2);
    let rr = run(&mut s, rr, 1).job_id().unwrap();
    let (_, rr_it, _) = iterate(&mut s, rr, 1);
    ok(&run(
        &mut s,
        d::FinishTasks {
            task_ids: vec![4000],
        },
        1,
    ));
    // A coordinated read takes the late worker in through a pending task
    // (the worker runs it, clients do not see it yet); the finished
    // iteration gives it nothing.
    let out = run(&mut s, worker("later:1"), 1);
    assert_eq!(out.worker_tasks(), Some(&[4002][..]));
    let it = s.dispatcher().iteration(rr_it).unwrap().clone();
    assert_eq!(it.tasks, vec![4001]);
    assert_eq!(it.pending.len(), 1);
    assert_eq!(
        (it.pending[0].task_id, it.pending[0].target_round),
        (4002, 1)
    );
}

#[test]
fn only_a_heartbeat_that_changes_the_worker_needs_proposing() {
    let mut s = state();
    let hb = worker("w:1");
    assert!(s.dispatcher().worker_heartbeat_changes(&hb));
    ok(&run(&mut s, hb.clone(), 1));
    assert!(!s.dispatcher().worker_heartbeat_changes(&hb));
    let mut moved = hb.clone();
    moved.transfer_servers = vec![b"grpc other".to_vec().into()];
    assert!(s.dispatcher().worker_heartbeat_changes(&moved));
    let digest = s.digest();
    let out = run(&mut s, hb, 2);
    assert_eq!(out.worker_tasks(), Some(&[][..]));
    assert_ne!(
        s.digest(),
        digest,
        "only the applied counter and clock move"
    );
    assert_eq!(s.dispatcher().workers().count(), 1);
}

#[test]
fn a_pending_task_joins_a_coordinated_read_once_every_consumer_blocked() {
    let mut s = state();
    ok(&run(&mut s, worker("a:1"), 1));
    let ds = register(&mut s, "g", "m");
    let mut rr = job(&ds, Some("rr"), 1);
    rr.num_consumers = Some(2);
    let rr = run(&mut s, rr, 1).job_id().unwrap();
    let (c0, it, _) = iterate(&mut s, rr, 1);
    let (c1, _, _) = iterate(&mut s, rr, 1);
    ok(&run(&mut s, worker("b:1"), 1));
    let hb = |client, current: Option<i64>, blocked: Option<i64>| d::ClientHeartbeat {
        iteration_client_id: client,
        current_round: current,
        blocked_round: blocked,
    };
    let pending = |s: &State| s.dispatcher().iteration(it).unwrap().pending.clone();
    assert_eq!(
        s.dispatcher()
            .block_round(s.dispatcher().iteration(it).unwrap()),
        Some(1)
    );
    // A client already at round 5 rejects target 1: the target moves to 5 + 2.
    ok(&run(&mut s, hb(c0, Some(5), None), 1));
    assert_eq!(
        (pending(&s)[0].target_round, pending(&s)[0].failures),
        (7, 1)
    );
    // Then 9 + 4 after a second rejection.
    ok(&run(&mut s, hb(c1, Some(9), None), 1));
    assert_eq!(pending(&s)[0].target_round, 13);
    // Both block at or before 13: the task joins, starting at round 13.
    ok(&run(&mut s, hb(c0, Some(10), Some(13)), 1));
    ok(&run(&mut s, hb(c0, Some(10), Some(13)), 1));
    assert_eq!(pending(&s)[0].ready_consumers, vec![c0], "counted once");
    ok(&run(&mut s, hb(c1, Some(11), Some(12)), 1));
    assert!(pending(&s).is_empty());
    let iteration = s.dispatcher().iteration(it).unwrap().clone();
    assert_eq!(iteration.tasks, vec![4000, 4001]);
    assert_eq!(s.dispatcher().task(4001).unwrap().starting_round, 13);
    // Removed, the task leaves the read; its worker back gets a new one.
    ok(&run(&mut s, d::RemoveTask { task_id: 4001 }, 1));
    assert_eq!(s.dispatcher().iteration(it).unwrap().tasks, vec![4000]);
    assert!(s.dispatcher().worker_heartbeat_changes(&worker("b:1")));
    let out = run(&mut s, worker("b:1"), 1);
    assert_eq!(out.worker_tasks(), Some(&[4002][..]));
    assert_eq!(pending(&s)[0].task_id, 4002);
    let remove = journal::pb::update::Command::from(d::RemoveTask { task_id: 1 });
    assert!(!journal::client_proposable(&remove));
}
