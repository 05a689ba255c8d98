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
    // A coordinated read gets no task for a late worker (pending-task
    // protocol not served), a finished iteration neither.
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
    let out = run(&mut s, worker("later:1"), 1);
    assert_eq!(out.worker_tasks(), Some(&[][..]));
    assert_eq!(s.dispatcher().iteration(rr_it).unwrap().tasks, vec![4001]);
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
