//! The rendezvous area: torchrun's dynamic rendezvous (torch 2.15's
//! `DynamicRendezvousHandler`, `docs/rendezvous.md`) decided by the state
//! machine. torch's handler keeps a run's whole state in one pickled blob
//! that every agent compare-and-sets, so N agents joining write O(N²)
//! bytes, one winner at a time; here an agent's join is one small command
//! ([`pb::rendezvous::Join`]) and the state puts it where torch's join op
//! would. Its own command, reply and state ([`Data`]).
//!
//! torch's rules, one for one (its join op, evaluated in this order):
//! * a closed run takes no one (the agent reads `closed` and raises; one on
//!   the redundancy list exits gracefully);
//! * an agent on the redundancy list stays there while the round has
//!   `max_nodes` participants, and leaves it otherwise;
//! * a participant of a formed round is done;
//! * an agent that is not a participant of a formed round goes on the wait
//!   list while the round has fewer than `max_nodes` participants, else on
//!   the redundancy list (unless on the wait list already);
//! * an agent that is not a participant of a round being formed becomes
//!   one (leaving the wait list); the round's last call starts when it has
//!   `min_nodes` participants, and it forms at once at `max_nodes`;
//! * a round forms ("complete") with `min_nodes` or more once its last call
//!   has passed ([`pb::rendezvous::Complete`], proposed by the leader);
//!   ranks are positions in torch's order of node descriptors (address,
//!   pid, local id);
//! * leaving ([`pb::rendezvous::Leave`], torch's exit op) or being dropped
//!   ([`pb::rendezvous::Expire`]): the last participant out of a formed
//!   round moves the run to its next round; a round being formed that falls
//!   below `min_nodes` loses its last call.
//!
//! What differs from torch: the decisions are made once, in log order, not
//! by each agent on a copy; deadlines are the leader's clock, not each
//! agent's wall clock; keep-alives are not in the state (the leader keeps
//! them and proposes `Expire`). A run's [`Run::epoch`] moves whenever an
//! agent that waits may act, so agents wait on it instead of polling.

mod order;

pub use order::{find, insert, remove};

use crate::area::{Area, Context, Object};
use crate::cluster::Cluster;
use crate::pb::rendezvous::{command::Command, Close, Complete, Expire, Join, Leave, Reply};
pub use crate::pb::rendezvous::{Data, Node, Place, Run, Settings, View};
use crate::pb::{self, outcome, Code, DomainError, Outcome};

/// Longest run id.
pub const MAX_RUN_BYTES: usize = 256;
/// Longest agent address.
pub const MAX_ADDR_BYTES: usize = 256;
/// Most agents a round may take.
pub const MAX_NODES: u32 = 1 << 16;
/// Most runs a namespace keeps.
pub const MAX_RUNS: usize = 1024;

fn answer(view: View) -> Outcome {
    Outcome {
        reply: Some(outcome::Reply::Rendezvous(Reply { view: Some(view) })),
        ..Default::default()
    }
}

fn invalid(message: String) -> DomainError {
    crate::errors::bare(Code::InvalidArgument, message)
}

/// Where `node` stands in `run`, and what it reads of it (`None`: the run
/// does not exist).
pub fn view(run: Option<&Run>, node: &Node) -> View {
    let Some(r) = run else {
        return View::default();
    };
    let mut v = View {
        round: r.round,
        complete: r.complete,
        closed: r.closed,
        waiting: r.wait_list.len() as u32,
        participants: r.participants.len() as u32,
        epoch: r.epoch,
        exists: true,
        ..Default::default()
    };
    if let Ok(rank) = find(&r.participants, node) {
        v.set_place(Place::Participant);
        if r.complete {
            v.rank = rank as u32;
            v.world_size = r.participants.len() as u32;
        }
    } else if find(&r.wait_list, node).is_ok() {
        v.set_place(Place::Waiting);
    } else if find(&r.redundancy_list, node).is_ok() {
        v.set_place(Place::Redundant);
    }
    v
}

/// Checks a join's names and settings.
fn check_join(j: &Join) -> Result<(&Node, Settings), DomainError> {
    check_run(&j.run)?;
    let node = check_node(j.node.as_ref())?;
    let s = j.settings.unwrap_or_default();
    if s.min_nodes == 0 || s.max_nodes < s.min_nodes || s.max_nodes > MAX_NODES {
        return Err(invalid(format!(
            "min_nodes {} and max_nodes {}: 1 <= min_nodes <= max_nodes <= {MAX_NODES}",
            s.min_nodes, s.max_nodes
        )));
    }
    if s.last_call_ms == 0 || s.liveness_ms == 0 {
        return Err(invalid(
            "the last call and the liveness window are positive".into(),
        ));
    }
    Ok((node, s))
}

fn check_run(run: &str) -> Result<(), DomainError> {
    if run.is_empty() || run.len() > MAX_RUN_BYTES {
        return Err(invalid(format!("a run id has 1 to {MAX_RUN_BYTES} bytes")));
    }
    Ok(())
}

fn check_node(node: Option<&Node>) -> Result<&Node, DomainError> {
    match node {
        Some(n) if !n.addr.is_empty() && n.addr.len() <= MAX_ADDR_BYTES => Ok(n),
        _ => Err(invalid(format!(
            "an agent has an address of 1 to {MAX_ADDR_BYTES} bytes"
        ))),
    }
}

/// The run's waiters may act: its epoch moves and they are woken.
fn moved(cx: &mut Context<'_>, name: &str, r: &mut Run) {
    r.epoch += 1;
    cx.touch(|| Object::Rendezvous(name.to_string()));
}

/// The round forms: ranks are the participants' positions.
fn form(r: &mut Run) {
    r.complete = true;
    r.last_call_ends_ms = 0;
}

/// torch's join op, one step (see the module's rules).
fn join(cx: &mut Context<'_>, data: &mut Data, j: &Join) -> Outcome {
    let (node, settings) = match check_join(j) {
        Ok(v) => v,
        Err(e) => return Outcome::err(e),
    };
    if !data.runs.contains_key(&j.run) && data.runs.len() >= MAX_RUNS {
        return Outcome::err(crate::errors::bare(
            Code::ResourceExhausted,
            format!("the namespace keeps {MAX_RUNS} rendezvous runs"),
        ));
    }
    let r = data.runs.entry(j.run.clone()).or_insert_with(|| Run {
        settings: Some(settings),
        ..Default::default()
    });
    let have = r.settings.unwrap_or_default();
    if (have.min_nodes, have.max_nodes) != (settings.min_nodes, settings.max_nodes) {
        return Outcome::err(crate::errors::bare(
            Code::FailedPrecondition,
            format!(
                "run {:?} takes {} to {} agents; this agent asks for {} to {}",
                j.run, have.min_nodes, have.max_nodes, settings.min_nodes, settings.max_nodes
            ),
        ));
    }
    let max = have.max_nodes as usize;
    let mut woke = false;
    if !r.closed {
        if find(&r.redundancy_list, node).is_ok() && r.participants.len() < max {
            remove(&mut r.redundancy_list, node);
        }
        if find(&r.redundancy_list, node).is_ok() || find(&r.participants, node).is_ok() {
            // Stays: redundant in a full round, or a participant.
        } else if r.complete {
            if r.participants.len() < max {
                insert(&mut r.wait_list, node);
            } else if find(&r.wait_list, node).is_err() {
                insert(&mut r.redundancy_list, node);
            }
        } else {
            remove(&mut r.wait_list, node);
            insert(&mut r.participants, node);
            let n = r.participants.len();
            if n == have.min_nodes as usize {
                r.last_call_ends_ms = cx.at_ms.saturating_add(have.last_call_ms).max(1);
            }
            if n == max {
                form(r);
                woke = true;
            }
        }
    }
    if woke {
        moved(cx, &j.run, r);
    }
    answer(view(Some(r), node))
}

/// Drops `node` from every list of `r`, with torch's epilogue for a
/// participant; whether it was a participant.
fn drop_node(r: &mut Run, node: &Node) -> bool {
    remove(&mut r.wait_list, node);
    remove(&mut r.redundancy_list, node);
    if !remove(&mut r.participants, node) {
        return false;
    }
    if r.complete && r.participants.is_empty() {
        r.complete = false;
        r.round += 1;
    } else if !r.complete
        && r.participants.len() < r.settings.unwrap_or_default().min_nodes as usize
    {
        r.last_call_ends_ms = 0;
    }
    true
}

fn leave(cx: &mut Context<'_>, data: &mut Data, l: &Leave) -> Outcome {
    let node = match check_run(&l.run).and_then(|()| check_node(l.node.as_ref())) {
        Ok(n) => n,
        Err(e) => return Outcome::err(e),
    };
    let Some(r) = data.runs.get_mut(&l.run) else {
        return answer(View::default());
    };
    if drop_node(r, node) {
        moved(cx, &l.run, r);
    }
    answer(view(Some(r), node))
}

fn close(cx: &mut Context<'_>, data: &mut Data, c: &Close) -> Outcome {
    if let Err(e) = check_run(&c.run) {
        return Outcome::err(e);
    }
    let Some(r) = data.runs.get_mut(&c.run) else {
        return answer(View::default());
    };
    if !r.closed {
        r.closed = true;
        moved(cx, &c.run, r);
    }
    answer(view(Some(r), &Node::default()))
}

/// The leader: the last call of round `c.round` passed (by its clock).
fn complete(cx: &mut Context<'_>, data: &mut Data, c: &Complete) -> Outcome {
    let Some(r) = data.runs.get_mut(&c.run) else {
        return Outcome::ok();
    };
    let min = r.settings.unwrap_or_default().min_nodes as usize;
    let due = r.last_call_ends_ms != 0 && cx.at_ms >= r.last_call_ends_ms;
    if r.round == c.round && !r.complete && !r.closed && due && r.participants.len() >= min {
        form(r);
        moved(cx, &c.run, r);
    }
    Outcome::ok()
}

/// The leader: these agents' keep-alives stopped.
fn expire(cx: &mut Context<'_>, data: &mut Data, e: &Expire) -> Outcome {
    let Some(r) = data.runs.get_mut(&e.run) else {
        return Outcome::ok();
    };
    let mut any = false;
    for n in &e.nodes {
        let listed = find(&r.wait_list, n).is_ok() || find(&r.redundancy_list, n).is_ok();
        any |= drop_node(r, n) || listed;
    }
    if any {
        moved(cx, &e.run, r);
    }
    Outcome::ok()
}

impl Area for Data {
    type Command = pb::rendezvous::Command;

    fn apply(&mut self, cx: &mut Context<'_>, c: &Self::Command) -> Outcome {
        match &c.command {
            None => Outcome::ok(),
            Some(Command::Join(j)) => join(cx, self, j),
            Some(Command::Leave(l)) => leave(cx, self, l),
            Some(Command::Close(c)) => close(cx, self, c),
            Some(Command::Complete(c)) => complete(cx, self, c),
            Some(Command::Expire(e)) => expire(cx, self, e),
        }
    }

    fn on_init(&mut self, _cx: &mut Context<'_>) {}

    /// A new job starts with no runs; their waiters are told.
    fn on_epoch_reset(&mut self, cx: &mut Context<'_>) {
        for name in self.runs.keys() {
            cx.touch(|| Object::Rendezvous(name.clone()));
        }
        *self = Data::default();
    }

    fn on_task_lost(&mut self, _cx: &mut Context<'_>, _task: u32) {}

    fn check_snapshot(&self, _cluster: Cluster<'_>) -> Result<(), String> {
        check_data(self)
    }

    fn check_invariants(&self, cluster: Cluster<'_>) -> Result<(), String> {
        self.check_snapshot(cluster)
    }
}

/// Every run's rules: valid settings; its lists sorted, without repeats
/// and apart; at most `max_nodes` participants; no last call on a formed
/// round.
pub(crate) fn check_data(d: &Data) -> Result<(), String> {
    for (name, r) in &d.runs {
        check_one(r).map_err(|e| format!("rendezvous run {name:?}: {e}"))?;
    }
    Ok(())
}

fn check_one(r: &Run) -> Result<(), String> {
    let s = r.settings.unwrap_or_default();
    if s.min_nodes == 0 || s.max_nodes < s.min_nodes {
        return Err(format!("settings {}..{}", s.min_nodes, s.max_nodes));
    }
    for (what, list) in [
        ("participants", &r.participants),
        ("wait list", &r.wait_list),
        ("redundancy list", &r.redundancy_list),
    ] {
        if !order::strictly_sorted(list) {
            return Err(format!("its {what} are not in order"));
        }
    }
    let apart = |a: &[Node], b: &[Node]| a.iter().all(|n| find(b, n).is_err());
    if !apart(&r.participants, &r.wait_list)
        || !apart(&r.participants, &r.redundancy_list)
        || !apart(&r.wait_list, &r.redundancy_list)
    {
        return Err("an agent is on two lists".into());
    }
    if r.participants.len() > s.max_nodes as usize {
        return Err(format!("{} participants", r.participants.len()));
    }
    if r.complete && r.last_call_ends_ms != 0 {
        return Err("a formed round keeps a last call".into());
    }
    Ok(())
}

/// The rendezvous state of a namespace, read-only.
#[derive(Clone, Copy)]
pub struct Reader<'a> {
    pub(crate) data: &'a Data,
}

impl<'a> Reader<'a> {
    /// Run `name`, if it exists.
    pub fn run(&self, name: &str) -> Option<&'a Run> {
        self.data.runs.get(name)
    }

    /// Every run, by name.
    pub fn runs(&self) -> impl Iterator<Item = (&'a String, &'a Run)> {
        self.data.runs.iter()
    }

    /// What `node` reads of run `name`.
    pub fn view(&self, name: &str, node: &Node) -> View {
        view(self.run(name), node)
    }
}

/// Every rendezvous command is a client's but the leader's own: completing
/// a round whose last call passed, dropping silent agents.
pub fn client_proposable(command: &Command) -> bool {
    matches!(
        command,
        Command::Join(_) | Command::Leave(_) | Command::Close(_)
    )
}

crate::area::area_commands!(rendezvous, Rendezvous, Join, Leave, Close, Complete, Expire);
