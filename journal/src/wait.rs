//! Parked calls: what a call that waits on the state waits for ([`Wait`]),
//! the one way to read its answer ([`crate::State::wait_result`]), and what
//! can change that answer ([`Object`]), so that a waiter is woken only by
//! changes of its own objects.
//!
//! A call that waits (a registration at the registration barrier, a barrier,
//! PollForError, GetAliveTasks, WatchTasks, a blocking get, a closure put
//! into a full queue, a worker's get, a fetch or a join) applies its update
//! (or reads), then re-reads [`crate::State::wait_result`] each time one of
//! its [`Wait::objects`] changes, until it answers. Applying an update
//! reports every object it changed ([`Touched`], see
//! [`crate::State::apply_traced`]); a change that concerns every waiter (a
//! job epoch reset, the service configured) is reported as
//! [`Touched::all`].

use bytes::Bytes;

pub use crate::area::{Object, Touched};
use crate::coordination::{self, AliveTasks};
use crate::namespace::{self, namespace_key, Namespace};
use crate::pb::closures::Assigned;
use crate::pb::DomainError;
use crate::State;

/// What a parked call waits for.
#[derive(Clone, Debug, PartialEq)]
pub enum Wait {
    /// A RegisterTask of `task` with `incarnation` at the registration
    /// barrier: answers [`Answer::Incarnation`].
    Registration {
        /// The task.
        task: u32,
        /// Its incarnation.
        incarnation: u64,
    },
    /// A barrier call (`call` from its outcome) at instance `counter` of
    /// `id`: answers [`Answer::Counter`].
    Barrier {
        /// The barrier id.
        id: String,
        /// The instance the call arrived at.
        counter: i64,
        /// The call.
        call: u64,
    },
    /// A ShutdownTask at the shutdown barrier: answers [`Answer::Done`].
    Shutdown {
        /// The call.
        call: u64,
    },
    /// A WaitForAllTasks at the device barrier: answers [`Answer::Done`].
    WaitForAll {
        /// The call.
        call: u64,
    },
    /// A PollForError of `task`: ends only with an error.
    Poll {
        /// The polling task.
        task: u32,
        /// The poll.
        call: u64,
    },
    /// A GetAliveTasks over `tasks` in round `generation`: answers
    /// [`Answer::Alive`].
    AliveTasks {
        /// The tasks asked about.
        tasks: Vec<u32>,
        /// The round.
        generation: u64,
    },
    /// A WatchTasks that knows task-state `version`: answers
    /// [`Answer::Done`] once the version is another.
    TaskStates {
        /// The version the caller knows.
        version: i64,
    },
    /// A blocking get of `key`: answers [`Answer::Value`].
    Key {
        /// The key (as the caller wrote it).
        key: String,
    },
    /// A closure put into a full queue: answers [`Answer::Done`] once its
    /// last closure (`last`) is admitted or cancelled.
    ClosurePut {
        /// The queue.
        queue: String,
        /// The put's last closure.
        last: u64,
    },
    /// A worker's get (`call` from its outcome): answers
    /// [`Answer::Assigned`].
    ClosureGet {
        /// The queue.
        queue: String,
        /// The call.
        call: u64,
    },
    /// A fetch of closures `ids`: answers [`Answer::Done`] once every one
    /// is settled. `settled` counts those found settled so far (settled
    /// outcomes never change, so a re-read starts after them).
    ClosuresSettled {
        /// The queue.
        queue: String,
        /// The closures.
        ids: Vec<u64>,
        /// How many of `ids`, from the front, are known settled.
        settled: usize,
    },
    /// A join of `queue`: answers [`Answer::Done`] once a step would
    /// answer (an error to raise, or nothing left to run).
    JoinReady {
        /// The queue.
        queue: String,
    },
    /// The waits of torch store connection `connection`, of which `seen`
    /// STOP_WAITING were written: answers [`Answer::Connection`] once it
    /// is owed more, or nothing stands that could wake it.
    StoreConnection {
        /// The connection's id.
        connection: u64,
        /// STOP_WAITING written to it so far.
        seen: u64,
    },
    /// An agent of rendezvous run `run` that read its epoch `epoch`:
    /// answers [`Answer::Done`] once the epoch moved (or the run is gone).
    Rendezvous {
        /// The run.
        run: String,
        /// The epoch the agent read.
        epoch: u64,
    },
}

/// A parked call's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// What it waited for happened.
    Done,
    /// The service incarnation (a registration).
    Incarnation(u64),
    /// The barrier instance that passed.
    Counter(i64),
    /// The rendezvous' alive tasks.
    Alive(AliveTasks),
    /// The key's value.
    Value(Bytes),
    /// The closure handed to a get, or `None`: nothing will come (its
    /// deadline passed, or the answer is gone).
    Assigned(Option<Assigned>),
    /// A torch store connection's waits, or `None`: its record is gone
    /// (forgotten, or the job's epoch was reset).
    Connection(Option<crate::torch::ConnectionView>),
}

impl Wait {
    /// What the call that proposed `command` waits for once its update is
    /// applied with outcome `out`, if anything: a parked registration,
    /// barrier, shutdown or closure put or get; every PollForError,
    /// GetAliveTasks and WaitForAllTasks (answered from a state that has
    /// applied the call). A join (`Done` that waits) and the calls that
    /// only read build their wait themselves.
    pub fn after(command: &crate::pb::update::Command, out: &crate::Outcome) -> Option<Wait> {
        use crate::pb::closures::{command::Command as Q, reply::Reply as QR};
        use crate::pb::coordination::command::Command as C;
        use crate::pb::update::Command;
        if out.is_err() {
            return None;
        }
        let call = out.call_id;
        match command {
            Command::Coordination(c) => match c.command.as_ref()? {
                C::RegisterTask(r) if out.parked => Some(Wait::Registration {
                    task: r.task,
                    incarnation: r.incarnation,
                }),
                C::BarrierArrive(b) if out.parked => Some(Wait::Barrier {
                    id: b.id.clone(),
                    counter: out.barrier_counter()?,
                    call,
                }),
                C::ShutdownTask(_) if out.parked => Some(Wait::Shutdown { call }),
                C::WaitForAllTasks(_) => Some(Wait::WaitForAll { call }),
                C::PollForError(p) => Some(Wait::Poll { task: p.task, call }),
                C::AliveTasks(a) => Some(Wait::AliveTasks {
                    tasks: a.tasks.clone(),
                    generation: out.alive_generation()?,
                }),
                _ => None,
            },
            Command::Closures(c) => match c.command.as_ref()? {
                Q::Put(p) if out.parked => {
                    let Some(crate::pb::outcome::Reply::Closures(r)) = &out.reply else {
                        return None;
                    };
                    let Some(QR::ClosureId(first)) = r.reply else {
                        return None;
                    };
                    Some(Wait::ClosurePut {
                        queue: p.queue.clone(),
                        last: first + p.more_payloads.len() as u64,
                    })
                }
                Q::Get(g) if out.parked => Some(Wait::ClosureGet {
                    queue: g.queue.clone(),
                    call,
                }),
                _ => None,
            },
            _ => None,
        }
    }

    /// The objects whose changes may change this wait's answer, in its
    /// namespace `s` (which names the shutdown and device barriers).
    pub fn objects(&self, s: &Namespace<'_>) -> Vec<Object> {
        let inc = s.service_incarnation();
        match self {
            Wait::Registration { task, .. } => vec![
                Object::Task(*task),
                Object::Barrier(coordination::REGISTER_BARRIER.into()),
            ],
            Wait::Barrier { id, .. } => vec![Object::Barrier(id.clone())],
            Wait::Shutdown { .. } => vec![Object::Barrier(coordination::shutdown_barrier_id(inc))],
            Wait::WaitForAll { .. } => {
                vec![Object::Barrier(coordination::wait_all_barrier_id(inc))]
            }
            Wait::Poll { task, .. } => vec![Object::Task(*task)],
            Wait::AliveTasks { tasks, .. } => {
                vec![Object::AliveRound(coordination::alive_round_key(tasks))]
            }
            Wait::TaskStates { .. } => vec![Object::TaskStates],
            Wait::Key { key } => vec![Object::Key(coordination::normalize_key(key))],
            Wait::ClosurePut { queue, .. }
            | Wait::ClosureGet { queue, .. }
            | Wait::ClosuresSettled { queue, .. }
            | Wait::JoinReady { queue } => vec![Object::Queue(queue.clone())],
            Wait::StoreConnection { connection, .. } => {
                vec![Object::StoreConnection(*connection)]
            }
            Wait::Rendezvous { run, .. } => vec![Object::Rendezvous(run.clone())],
        }
    }

    /// Whether the call that waits is a coordination call (else a closure
    /// queue's).
    pub fn is_coordination(&self) -> bool {
        !matches!(
            self,
            Wait::ClosurePut { .. }
                | Wait::ClosureGet { .. }
                | Wait::ClosuresSettled { .. }
                | Wait::JoinReady { .. }
                | Wait::StoreConnection { .. }
                | Wait::Rendezvous { .. }
        )
    }

    /// The label of the kind of call that waits (metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Wait::Registration { .. } => "register",
            Wait::Barrier { .. } => "barrier",
            Wait::Shutdown { .. } => "shutdown",
            Wait::WaitForAll { .. } => "wait_for_all_tasks",
            Wait::Poll { .. } => "poll_for_error",
            Wait::AliveTasks { .. } => "alive_tasks",
            Wait::TaskStates { .. } => "watch_tasks",
            Wait::Key { .. } => "kv_get",
            Wait::ClosurePut { .. } => "closure_put",
            Wait::ClosureGet { .. } => "closure_get",
            Wait::ClosuresSettled { .. } | Wait::JoinReady { .. } => "closure_fetch",
            Wait::StoreConnection { .. } => "torch_wait",
            Wait::Rendezvous { .. } => "rendezvous",
        }
    }
}

impl State {
    /// The answer of a call parked in namespace `ns` waiting for `wait`, or
    /// `None` while it keeps waiting. A wait that belongs to job `epoch` (a
    /// coordination call, which named its tasks in that epoch) ends with
    /// ABORTED once another epoch began; every wait of a namespace that was
    /// deleted ends at once (UNAVAILABLE for a coordination call, NOT_FOUND
    /// for a closure queue's). `wait` is `mut` for the progress a fetch
    /// keeps ([`Wait::ClosuresSettled`]).
    pub fn wait_result(
        &self,
        ns: &str,
        epoch: Option<u64>,
        wait: &mut Wait,
    ) -> Option<Result<Answer, DomainError>> {
        let Some(n) = self.namespace(ns) else {
            let coordination = wait.is_coordination();
            return Some(Err(namespace::deleted(namespace_key(ns), coordination)));
        };
        if epoch.is_some_and(|e| e != n.epoch()) {
            return Some(Err(crate::errors::epoch_reset()));
        }
        let c = n.coordination();
        let q = n.closures();
        match wait {
            Wait::Registration { task, incarnation } => c
                .registration_result(*task, *incarnation)
                .map(|r| r.map(Answer::Incarnation)),
            Wait::Barrier { id, counter, call } => c
                .barrier_result(id, *counter, *call)
                .map(|r| r.map(Answer::Counter)),
            Wait::Shutdown { call } => c.shutdown_result(*call).map(|r| r.map(|()| Answer::Done)),
            Wait::WaitForAll { call } => c
                .wait_for_all_result(*call)
                .map(|r| r.map(|()| Answer::Done)),
            Wait::Poll { task, call } => c.poll_result(*task, *call).map(Err),
            Wait::AliveTasks { tasks, generation } => c
                .alive_result(tasks, *generation)
                .map(|r| r.map(Answer::Alive)),
            Wait::TaskStates { version } => {
                c.watch_tasks_ready(*version).then_some(Ok(Answer::Done))
            }
            Wait::Key { key } => c.kv_get(key).map(|v| Ok(Answer::Value(v.clone()))),
            Wait::ClosurePut { last, .. } => q
                .closure(*last)
                .is_none_or(|c| c.state() != crate::closures::ClosureState::Pending)
                .then_some(Ok(Answer::Done)),
            Wait::ClosureGet { queue, call } => match q.get_answer(queue, *call) {
                crate::closures::GetAnswer::Waiting => None,
                crate::closures::GetAnswer::Gone => Some(Ok(Answer::Assigned(None))),
                crate::closures::GetAnswer::Assigned(c) => {
                    Some(Ok(Answer::Assigned(Some(Assigned {
                        closure_id: c.id,
                        payload: c.payload.clone(),
                        attempt: c.attempts,
                        tag: c.tag.clone(),
                        lease_expires_ms: c.lease_expires_ms,
                    }))))
                }
            },
            Wait::ClosuresSettled {
                queue,
                ids,
                settled,
            } => all_settled(&q, queue, ids, settled),
            Wait::JoinReady { queue } => q.join_ready(queue).then_some(Ok(Answer::Done)),
            Wait::StoreConnection { connection, seen } => match n.torch().connection(*connection) {
                None => Some(Ok(Answer::Connection(None))),
                Some(v) if v.stops > *seen || v.registered == 0 => {
                    Some(Ok(Answer::Connection(Some(v))))
                }
                Some(_) => None,
            },
            Wait::Rendezvous { run, epoch } => n
                .rendezvous()
                .run(run)
                .is_none_or(|r| r.epoch != *epoch)
                .then_some(Ok(Answer::Done)),
        }
    }
}

/// Whether closures `ids` of `queue` are all settled, counting in
/// `settled` those found so (settled outcomes never change).
fn all_settled(
    q: &crate::closures::Reader<'_>,
    queue: &str,
    ids: &[u64],
    settled: &mut usize,
) -> Option<Result<Answer, DomainError>> {
    while let Some(&id) = ids.get(*settled) {
        match q.settled(queue, id) {
            Err(e) => return Some(Err(e)),
            Ok(None) => return None,
            Ok(Some(_)) => *settled += 1,
        }
    }
    Some(Ok(Answer::Done))
}
