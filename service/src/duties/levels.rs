//! The feature-level duty: the leader asks every member (voters and
//! learners) which journal feature level it applies — at once when it takes
//! over, then every 200 ms while the cluster runs below this build's
//! level (a write that needs the level waits for it: on a cluster just
//! bootstrapped, the first ask can find a member not answering yet) and
//! every 30 s after — and raises the cluster's level to the
//! lowest answer (`SetFeatureLevel`) when that is higher. A member that
//! does not answer keeps the level where it is; the level never falls. A
//! member below the level the cluster already runs at (a node replaced by
//! an older build) is logged once: it cannot apply the cluster's state.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use journal::pb::{update::Command, SetFeatureLevel};
use journal::Update;

use super::{Duty, DutyFuture};
use crate::core::LocalLeader;

/// How often the members are asked while the cluster runs below this
/// build's level...
const ASK_EVERY: Duration = Duration::from_millis(200);
/// ...and after.
const ASK_AT_LEVEL_EVERY: Duration = Duration::from_secs(30);

/// Raises the cluster's journal feature level.
#[derive(Default)]
pub struct LevelDuty {
    /// When the members are next asked.
    next: Mutex<Option<Instant>>,
    /// A round of asking is out (it runs in a task of its own: a member
    /// that does not answer must not hold up the other duties).
    asking: Arc<AtomicBool>,
    /// The members logged as below the cluster's level, with that level.
    told: Arc<Mutex<BTreeSet<(u64, u32)>>>,
}

impl LevelDuty {
    /// Whether the members are to be asked now (next again `every` later).
    fn due(&self, every: Duration) -> bool {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if next.is_some_and(|t| now < t) {
            return false;
        }
        *next = Some(now + every);
        true
    }
}

/// Asks every member's level and raises the cluster's to the lowest, if
/// that is higher than the level raised so far.
async fn ask_and_raise(leader: LocalLeader, told: &Mutex<BTreeSet<(u64, u32)>>) {
    let node = leader.node();
    let levels = node.member_levels().await;
    let (raised, runs_at) = node.state().read(|s| (s.raised_level(), s.feature_level()));
    for (id, level) in &levels {
        if let Ok(l) = level {
            let first = told
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((*id, *l));
            if *l < runs_at && first {
                tracing::error!(
                    "node {id} applies journal feature level {l} ({}), below the level {runs_at} \
                     the cluster runs at: it cannot apply the cluster's state; run a build of \
                     level {runs_at} or newer on it",
                    journal::level::describe(*l)
                );
            }
        }
    }
    let Some(lowest) = levels
        .values()
        .map(|l| l.as_ref().ok().copied())
        .collect::<Option<Vec<u32>>>()
        .and_then(|l| l.into_iter().min())
    else {
        return;
    };
    let level = lowest.min(journal::FEATURE_LEVEL);
    if level <= raised {
        return;
    }
    let update = Update::from(Command::SetFeatureLevel(SetFeatureLevel { level }));
    if super::propose("levels", &leader, &update).await.is_some() {
        tracing::info!(
            "every member applies journal feature level {level} ({}): the cluster runs at it now",
            journal::level::describe(level)
        );
    }
}

impl Duty for LevelDuty {
    fn name(&self) -> &'static str {
        "levels"
    }

    fn on_takeover<'a>(&'a self, _leader: &'a LocalLeader) -> DutyFuture<'a> {
        *self.next.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.told.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Box::pin(async {})
    }

    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            let raised = leader.node().state().read(|s| s.raised_level());
            let every = match raised >= journal::FEATURE_LEVEL {
                true => ASK_AT_LEVEL_EVERY,
                false => ASK_EVERY,
            };
            if !self.due(every) || self.asking.swap(true, Ordering::AcqRel) {
                return;
            }
            let (leader, asking, told) = (leader.clone(), self.asking.clone(), self.told.clone());
            tokio::spawn(async move {
                ask_and_raise(leader, &told).await;
                asking.store(false, Ordering::Release);
            });
        })
    }

    fn on_step_down(&self) {}
}
