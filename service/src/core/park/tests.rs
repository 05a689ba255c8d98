use super::*;
use journal::pb::{coordination::KvInsert, update::Command, ResetJobEpoch};
use journal::Update;
use storage::ApplyObserver;

fn insert(key: &str) -> Update {
    Update {
        command: Some(Command::from(KvInsert {
            key: key.into(),
            value: "v".into(),
            allow_overwrite: true,
        })),
        ..Default::default()
    }
}

/// Applies `u` and tells `wakers` what it touched.
fn apply(wakers: &Wakers, s: &mut State, u: &Update) {
    let mut touched = Touched::default();
    s.apply_traced(u, &mut touched);
    wakers.changed(s, &touched);
}

/// Whether `f` wakes a waiter that was waiting before it ran.
fn woken(r: &Registration<'_>, f: impl FnOnce()) -> bool {
    let mut n = std::pin::pin!(r.notified());
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(n.as_mut().poll(&mut cx).is_pending(), "woken before");
    f();
    n.as_mut().poll(&mut cx).is_ready()
}

#[test]
fn a_change_wakes_the_waiters_of_exactly_the_keys_it_wrote() {
    let wakers = Wakers::default();
    let mut s = State::new();
    let key = |k: &str| vec![Object::Key(k.into())];
    let (a, b) = (
        wakers.register("", key("a"), vec![]),
        wakers.register("", key("b"), vec![]),
    );
    assert!(woken(&a, || apply(&wakers, &mut s, &insert("a"))));
    assert!(!woken(&b, || apply(&wakers, &mut s, &insert("a"))));
    assert!(woken(&b, || apply(&wakers, &mut s, &insert("b"))));
    drop(a);
    // b's key and the default namespace's waiters.
    assert_eq!(wakers.waited(), 2);
}

#[test]
fn a_watch_on_one_key_is_not_woken_by_ten_thousand_writes_to_others() {
    let wakers = Wakers::default();
    let mut s = State::new();
    let watched = Object::Key("job/watched".into());
    let watch = wakers.register("", vec![watched.clone()], vec![]);
    let dir = wakers.register("", vec![], vec!["job/dir".into()]);
    for i in 0..10_000 {
        apply(&wakers, &mut s, &insert(&format!("job/other/{i}")));
    }
    assert_eq!(wakers.wakeups("", &watched), 0);
    assert!(!woken(&watch, || {}));
    // A write under the watched directory wakes the directory's watch
    // (and not the key's).
    assert!(woken(&dir, || apply(
        &wakers,
        &mut s,
        &insert("job/dir/x/y")
    )));
    assert_eq!(wakers.wakeups("", &watched), 0);
    assert!(woken(&watch, || apply(
        &wakers,
        &mut s,
        &insert("job/watched")
    )));
    assert_eq!(wakers.wakeups("", &watched), 1);
}

#[test]
fn an_epoch_reset_or_a_stop_wakes_everyone() {
    let wakers = Wakers::default();
    let mut s = State::new();
    let a = wakers.register("", vec![Object::Key("a".into())], vec![]);
    let reset = Update::from(Command::ResetJobEpoch(ResetJobEpoch::default()));
    assert!(woken(&a, || apply(&wakers, &mut s, &reset)));
    assert!(woken(&a, || wakers.stopped()));
    assert!(wakers.is_closed());
}

#[test]
fn the_directories_above_a_key() {
    assert_eq!(
        dirs_of("a/b/c").collect::<Vec<_>>(),
        ["a/b/c", "a/b", "a", ""]
    );
    assert_eq!(dirs_of("a").collect::<Vec<_>>(), ["a", ""]);
    assert_eq!(dirs_of("").collect::<Vec<_>>(), [""]);
}
