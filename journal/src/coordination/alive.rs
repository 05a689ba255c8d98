//! GetAliveTasks rendezvous and WatchTasks versions (`docs/protocols.md`,
//! GetAliveTasks and WatchTasks).

use super::barrier::sorted_set;
use super::errors::{self, UnknownTaskIn};
use super::{Reader, Writer};
use crate::area::Object;
use crate::pb::coordination::{AliveResult, AliveRound, TaskStatus};
use crate::pb::{DomainError, Outcome};

/// Completed rounds remembered per task set, for late readers.
const ALIVE_RESULTS_KEPT: usize = 8;

/// The key of the GetAliveTasks round over `tasks` (any order, repeats
/// allowed): what a waiter on it watches (see [`crate::wait::Object`]).
pub fn alive_round_key(tasks: &[u32]) -> String {
    round_key(&sorted_set(tasks))
}

fn round_key(set: &[u32]) -> String {
    set.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The alive tasks a GetAliveTasks round agreed on, with their incarnations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AliveTasks {
    /// Alive task indices, ascending.
    pub tasks: Vec<u32>,
    /// Their incarnations, parallel to `tasks`.
    pub incarnations: Vec<u64>,
}

impl Writer<'_, '_> {
    /// A task joins the GetAliveTasks rendezvous over `tasks`. The outcome is
    /// parked with `value` = the round's generation; read the answer with
    /// `Wait::AliveTasks`.
    pub(crate) fn alive_tasks(&mut self, task: u32, tasks: &[u32]) -> Outcome {
        if let Err(e) = self.data.check_task(task, UnknownTaskIn::AliveTasks) {
            return Outcome::err(e);
        }
        if let Some(&bad) = tasks.iter().find(|&&t| t >= self.data.task_count()) {
            return Outcome::err(errors::unknown_task(
                UnknownTaskIn::AliveTasks,
                &bad.to_string(),
            ));
        }
        let set = sorted_set(tasks);
        if set.binary_search(&task).is_err() {
            return Outcome::err(errors::alive_requester_not_in_set(&self.cl.label(task)));
        }
        let call = self.next_call_id();
        let key = round_key(&set);
        self.cx.touch(|| Object::AliveRound(key.clone()));
        let round = self.data.alive_rounds.entry(key).or_insert(AliveRound {
            generation: 1,
            tasks: set,
            ..Default::default()
        });
        round.callers.insert(task, call);
        let generation = round.generation;
        self.reevaluate_alive_rounds();
        let mut out = super::alive_generation(generation);
        out.parked = true;
        out.call_id = call;
        out
    }

    /// Completes every round in which all currently CONNECTED tasks of the
    /// set have called.
    ///
    /// Runs on every task that connects or disconnects, so its cost is that
    /// of the rounds with callers (none, mostly), never of the whole task
    /// list: a job of N tasks connecting at once stays O(N), not O(N²).
    pub(crate) fn reevaluate_alive_rounds(&mut self) {
        let tasks = &self.data.tasks;
        let status = |t: u32| tasks.get(t as usize).map(|e| (e.status(), e.incarnation));
        for (key, round) in self.data.alive_rounds.iter_mut() {
            if round.callers.is_empty() {
                continue;
            }
            let alive: Vec<u32> = round
                .tasks
                .iter()
                .copied()
                .filter(|&t| status(t).is_some_and(|(s, _)| s == TaskStatus::Connected))
                .collect();
            if !alive.iter().all(|t| round.callers.contains_key(t)) {
                continue;
            }
            let incarnations = alive
                .iter()
                .map(|&t| status(t).map_or(0, |(_, inc)| inc))
                .collect();
            round.results.push(AliveResult {
                generation: round.generation,
                tasks: alive,
                incarnations,
            });
            if round.results.len() > ALIVE_RESULTS_KEPT {
                round.results.remove(0);
            }
            round.generation += 1;
            round.callers.clear();
            self.cx.touch(|| Object::AliveRound(key.clone()));
        }
    }
}

impl<'a> Reader<'a> {
    /// The answer of a parked GetAliveTasks over `tasks` in round
    /// `generation`, or `None` while the round is open.
    pub(crate) fn alive_result(
        &self,
        tasks: &[u32],
        generation: u64,
    ) -> Option<Result<AliveTasks, DomainError>> {
        let Some(round) = self.data.alive_rounds.get(&round_key(&sorted_set(tasks))) else {
            return Some(Err(errors::epoch_reset()));
        };
        if let Some(r) = round.results.iter().find(|r| r.generation == generation) {
            return Some(Ok(AliveTasks {
                tasks: r.tasks.clone(),
                incarnations: r.incarnations.clone(),
            }));
        }
        if round.generation == generation {
            None
        } else {
            Some(Err(errors::alive_round_gone()))
        }
    }

    /// Whether a WatchTasks call with `version` answers now: always, unless it
    /// names the current version (then it waits for the next change). A
    /// version from the future answers at once instead of failing.
    pub(crate) fn watch_tasks_ready(&self, version: i64) -> bool {
        version != self.data.tasks_version
    }
}
