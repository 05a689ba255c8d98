use super::*;

fn call() -> Call {
    Call::new(CallContext::default())
}

#[test]
fn a_call_is_made_of_what_its_transport_knows() {
    let c = call();
    assert_eq!((c.namespace(), c.namespace_key()), ("default", ""));
    let c = Call::new(CallContext {
        namespace: Some("job-a".into()),
        ..Default::default()
    });
    assert_eq!(c.namespace(), "job-a");
    assert_eq!(
        c.update(Command::Noop(journal::pb::Noop {})).namespace,
        "job-a"
    );
    let d = Call::new(CallContext {
        namespace: Some("default".into()),
        ..Default::default()
    });
    assert_eq!(d.namespace_key(), "");
}

#[test]
fn client_names_match_the_namespace_patterns() {
    assert!(glob("job-a.*", "job-a.workers"));
    assert!(glob("*", "anything"));
    assert!(glob("a*b*c", "a-x-b-y-c"));
    assert!(!glob("a*b*c", "a-x-c-y-b"));
    assert!(!glob("job-a", "job-ab"));
    assert!(glob("job-a", "job-a"));
    let mut c = call();
    let none = Admins::default();
    assert!(c.admit(&[], &none).is_ok(), "no list: any client");
    let allow = vec!["job-a*".to_string()];
    assert_eq!(
        c.admit(&allow, &none).unwrap_err().code,
        tonic::Code::PermissionDenied as i32
    );
    c.client_names = OnceLock::from(Some(vec!["job-b".into()]));
    let e = c.admit(&allow, &none).unwrap_err();
    assert!(e.message.contains("job-b"), "{e:?}");
    c.client_names = OnceLock::from(Some(vec!["job-b".into(), "job-a.worker-1".into()]));
    assert!(c.admit(&allow, &none).is_ok());
}

#[test]
fn only_an_admin_runs_a_cluster_verb_and_enters_every_namespace() {
    let admins = Admins {
        identities: true,
        names: vec!["ops-*".into()],
    };
    let as_named = |names: &[&str]| {
        let c = call();
        let names = names.iter().map(|n| n.to_string()).collect();
        c.client_names.set(Some(names)).unwrap();
        c
    };
    let job = as_named(&["job-a"]);
    let e = job
        .admit_cluster_verb("namespace delete", &admins)
        .unwrap_err()
        .into_plain_status();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(
        e.message().contains("namespace delete")
            && e.message().contains("job-a")
            && e.message().contains("ops-*"),
        "{e:?}"
    );
    let ops = as_named(&["ops-alice"]);
    assert!(ops.admit_cluster_verb("namespace delete", &admins).is_ok());
    // An admin enters a namespace that does not list it; a job does not
    // enter another's.
    let allow = vec!["job-b".to_string()];
    assert!(ops.admit(&allow, &admins).is_ok());
    assert!(job.admit(&allow, &admins).is_err());
    // No admin named: every client is refused, and the message says why.
    let nobody = Admins {
        identities: true,
        names: Vec::new(),
    };
    let e = ops
        .admit_cluster_verb("snapshot save", &nobody)
        .unwrap_err()
        .into_plain_status();
    assert!(e.message().contains("names no admin"), "{e:?}");
    // No identities (no client CA): the network is the boundary.
    let open = Admins::default();
    assert!(job.admit_cluster_verb("namespace delete", &open).is_ok());
    // The names are not admins without identities required (they could
    // only come from a certificate the port does not check).
    let unchecked = Admins {
        identities: false,
        names: vec!["ops-*".into()],
    };
    assert!(ops.admit(&allow, &unchecked).is_err());
    // A peer's forward was admitted where it arrived.
    assert!(Call::internal().admit_cluster_verb("x", &nobody).is_ok());
}

#[test]
fn the_first_task_resolution_fixes_the_epoch() {
    let c = Call::internal();
    assert_eq!(c.epoch(), None);
    c.named_in(4);
    c.named_in(5);
    assert_eq!(c.epoch(), Some(4));
    assert_eq!(c.update(Command::Noop(journal::pb::Noop {})).epoch, Some(4));
}

#[test]
fn a_call_without_an_origin_gets_one_on_a_lane() {
    let lanes = Lanes::new();
    let (c, lane) = Call::internal().with_origin(&lanes);
    let o = c.origin().unwrap();
    assert_eq!(o.seq, 1);
    assert!(lane.is_some());
    let (again, lane) = c.with_origin(&lanes);
    assert_eq!(again.origin(), Some(o), "it has one already");
    assert!(lane.is_none());
}

#[test]
fn a_sessions_requests_keep_its_admission_and_deadline_with_their_own_origin() {
    let deadline = Instant::now() + std::time::Duration::from_secs(9);
    let admitted = Call::new(CallContext {
        namespace: Some("job".into()),
        deadline: Some(deadline),
        retried_elsewhere: true,
        ..Default::default()
    })
    .in_session(77);
    let r = admitted.request(5);
    assert_eq!(r.namespace(), "job");
    assert_eq!(r.deadline(), Some(deadline));
    assert!(r.retried_elsewhere() && !r.forwarded());
    let o = r.origin().unwrap();
    assert_eq!((o.client_id, o.seq, o.done_below), (77, 5, 5));
    // An internal call passes every check; a session's does not.
    let open = Admins {
        identities: true,
        names: vec![],
    };
    assert!(Call::internal().admit_cluster_verb("x", &open).is_ok());
    assert!(r.admit_cluster_verb("x", &open).is_err());
}
