//! One way to wait in tests: [`eventually`] (async) and
//! [`eventually_blocking`] look at a condition until it holds or a deadline
//! passes, at one shared pace, and fail naming what was awaited and the
//! last thing seen. A test waits on something it can observe (a status, a
//! line, a metric, a count), never on time alone.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// The first pause between two looks; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between two looks.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// What is awaited, for how long, and what to add to a failure.
pub struct Wait<'a> {
    what: String,
    timeout: Duration,
    context: Option<Box<dyn Fn() -> String + Send + Sync + 'a>>,
}

/// A wait for `what` of at most `timeout`.
pub fn wait(what: impl Into<String>, timeout: Duration) -> Wait<'static> {
    Wait {
        what: what.into(),
        timeout,
        context: None,
    }
}

impl<'a> Wait<'a> {
    /// The same wait, adding `context()` (logs, say) to its failure.
    pub fn context<'b>(self, context: impl Fn() -> String + Send + Sync + 'b) -> Wait<'b> {
        Wait {
            what: self.what,
            timeout: self.timeout,
            context: Some(Box::new(context)),
        }
    }

    /// Looks at `check` until it answers `Ok` (returned) or the timeout
    /// passes (a panic naming what was awaited and `check`'s last `Err`).
    pub async fn until<T, E, F, Fut>(self, mut check: F) -> T
    where
        E: Debug,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut pause = FIRST_PAUSE;
        loop {
            let last = match check().await {
                Ok(v) => return v,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                self.fail(last);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// [`Wait::until`] for a condition that blocks (a file, a process).
    pub fn until_blocking<T, E: Debug>(self, mut check: impl FnMut() -> Result<T, E>) -> T {
        let deadline = Instant::now() + self.timeout;
        let mut pause = FIRST_PAUSE;
        loop {
            let last = match check() {
                Ok(v) => return v,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                self.fail(last);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    fn fail(&self, last: impl Debug) -> ! {
        let context = self.context.as_ref().map(|c| c()).unwrap_or_default();
        panic!(
            "timed out after {:?} waiting for {}; last seen: {last:?}\n{context}",
            self.timeout, self.what
        )
    }
}

/// Waits until `check` answers `Ok` (see [`Wait::until`]).
pub async fn eventually<T, E, F, Fut>(what: impl Into<String>, timeout: Duration, check: F) -> T
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    wait(what, timeout).until(check).await
}

/// Waits until `check` answers `Ok`, blocking (see [`Wait::until_blocking`]).
pub fn eventually_blocking<T, E: Debug>(
    what: impl Into<String>,
    timeout: Duration,
    check: impl FnMut() -> Result<T, E>,
) -> T {
    wait(what, timeout).until_blocking(check)
}

/// `Ok(())` if `holds`, else `Err(seen)`: a boolean condition for
/// [`eventually`], with what was seen instead.
pub fn holds<E>(holds: bool, seen: impl FnOnce() -> E) -> Result<(), E> {
    if holds {
        Ok(())
    } else {
        Err(seen())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn it_returns_what_the_condition_gives_once_it_holds() {
        let mut n = 0;
        let got = eventually("three looks", Duration::from_secs(5), || {
            n += 1;
            let seen = n;
            async move { holds(seen >= 3, || seen).map(|()| seen) }
        })
        .await;
        assert_eq!(got, 3);
    }

    #[test]
    fn it_names_what_it_awaited_and_the_last_thing_seen() {
        let failed = std::panic::catch_unwind(|| {
            eventually_blocking("the impossible", Duration::from_millis(50), || {
                Err::<(), _>("still nothing")
            })
        })
        .unwrap_err();
        let message = failed.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("waiting for the impossible") && message.contains("still nothing"),
            "{message}"
        );
    }
}
