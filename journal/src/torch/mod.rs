//! The PyTorch store area: the state of torch's c10d `TCPStore` — keys,
//! queues and the waits of each connection — as torch 2.15's libuv server
//! keeps it (`docs/pytorch.md`), replicated, so a job's rendezvous and its
//! process groups' id exchange outlive any node. Its own command
//! ([`pb::torch::Command`]), reply and state ([`Data`]).
//!
//! The server's rules, one for one:
//! * a value is bytes; GET of a missing key is empty; ADD reads the value
//!   with `stoll` rules and stores canonical decimal ([`number`]);
//! * COMPARE_SET on a missing key sets it only when `expected` is empty and
//!   otherwise answers `expected`; every path wakes the key's waiters;
//! * a WAIT that finds every key (stored, or a non-empty queue) answers at
//!   once; else its connection is registered on each key not stored and
//!   its count of awaited keys set to their number (a second WAIT sets it
//!   anew); a write of a key counts down every connection registered on
//!   it and drops the key's registrations; a connection that reaches zero
//!   is owed one STOP_WAITING; a queue push counts down registered
//!   connections in order up to the first that reaches zero and drops
//!   nothing; DELETE_KEY wakes nobody;
//! * BARRIER adds one to an ASCII counter without waking anyone, answers
//!   at once and wakes the key's waiters when the count reaches the world
//!   size, else waits on the key for one wake; the counter is a key like
//!   any other and is never reset;
//! * CANCEL_WAIT drops every registration of the connection.
//!
//! What the state adds: the STOP_WAITING a connection is owed are counted
//! ([`pb::torch::Connection::stops`]), so the node that holds the
//! connection, any node, writes them; a connection's waits end when it is
//! closed ([`pb::torch::Forget`]) or no node has said it is alive for a
//! while ([`pb::torch::Touch`]); keys and queues count against the
//! namespace's bounds on keys and bytes.

pub mod number;
mod reader;
mod writer;

pub use reader::{ConnectionView, Reader};
use writer::Writer;

use std::collections::BTreeMap;

pub use crate::pb::torch::{Data, Popped, Waited};

pub use crate::area::Held;
use crate::area::{Area, Context, Object};
use crate::cluster::Cluster;
use crate::pb::torch::{command::Command, reply, Reply};
use crate::pb::{self, outcome, Code, DomainError, Outcome};

/// How long (leader clock) the waits of a connection no node has said is
/// alive are kept, where a [`pb::torch::Touch`] names none.
pub const DEFAULT_CONNECTION_HORIZON_MS: u64 = 5 * 60 * 1000;

impl Reply {
    fn of(r: reply::Reply) -> Reply {
        Reply { reply: Some(r) }
    }
}

fn answer(r: reply::Reply) -> Outcome {
    Outcome {
        reply: Some(outcome::Reply::Torch(Reply::of(r))),
        ..Default::default()
    }
}

/// A counter that is not a number to torch's `stoll`.
pub fn not_a_number(key: &str) -> DomainError {
    crate::errors::bare(
        Code::InvalidArgument,
        format!("the value of key {key:?} is not a number"),
    )
}

impl Area for Data {
    type Command = pb::torch::Command;

    fn apply(&mut self, cx: &mut Context<'_>, c: &Self::Command) -> Outcome {
        let Some(cmd) = &c.command else {
            return Outcome::ok();
        };
        let cl = cx.cluster;
        let mut w = Writer { cl, data: self, cx };
        let out = w.apply(cmd);
        // Post: the byte count counts what is stored (checked where that is
        // cheap; the state's invariant checks sample the rest).
        debug_assert!(
            self.kv.len() + self.queues.len() > 1024 || self.bytes == counted_bytes(self)
        );
        out
    }

    /// The store starts empty with the service.
    fn on_init(&mut self, _cx: &mut Context<'_>) {}

    /// A new job starts with an empty store; the waits of the old one end
    /// (their connections are told: their records are gone).
    fn on_epoch_reset(&mut self, cx: &mut Context<'_>) {
        for id in self.connections.keys() {
            cx.touch(|| Object::StoreConnection(*id));
        }
        *self = Data::default();
    }

    /// Connections are not tasks.
    fn on_task_lost(&mut self, _cx: &mut Context<'_>, _task: u32) {}

    fn check_snapshot(&self, _cluster: Cluster<'_>) -> Result<(), String> {
        check_data(self)
    }

    fn check_invariants(&self, cluster: Cluster<'_>) -> Result<(), String> {
        self.check_snapshot(cluster)
    }
}

/// The store's rules: its byte count counts what it holds, no queue is
/// kept empty, and its waits are consistent (see [`check_waits`]).
pub(crate) fn check_data(d: &Data) -> Result<(), String> {
    if d.bytes != counted_bytes(d) {
        return Err(format!(
            "the torch store counts {} bytes but holds {}",
            d.bytes,
            counted_bytes(d)
        ));
    }
    if let Some(k) = d.queues.iter().find(|(_, q)| q.items.is_empty()) {
        return Err(format!("torch queue {:?} is kept empty", k.0));
    }
    check_waits(d)
}

/// Every registration names a connection with a record, and each record
/// counts its registrations.
fn check_waits(d: &Data) -> Result<(), String> {
    let mut registered: BTreeMap<u64, u64> = BTreeMap::new();
    for (key, w) in &d.waiting {
        if w.connections.is_empty() {
            return Err(format!("torch key {key:?} keeps an empty list of waiters"));
        }
        for c in &w.connections {
            *registered.entry(*c).or_default() += 1;
        }
    }
    for (id, c) in &d.connections {
        if registered.get(id).copied().unwrap_or(0) != c.registered {
            return Err(format!(
                "torch connection {id:x} miscounts its registrations"
            ));
        }
    }
    match registered.keys().find(|id| !d.connections.contains_key(id)) {
        Some(id) => Err(format!("torch connection {id:x} waits without a record")),
        None => Ok(()),
    }
}

/// Bytes of every key and value, and every queue's key and items.
pub(crate) fn counted_bytes(d: &Data) -> u64 {
    let kv: usize = d.kv.iter().map(|(k, v)| k.len() + v.len()).sum();
    let queues: usize = d
        .queues
        .iter()
        .map(|(k, q)| k.len() + q.items.iter().map(|i| i.len()).sum::<usize>())
        .sum();
    (kv + queues) as u64
}

/// Whether clients may propose `command` (every store command but the
/// bookkeeping of connections, which their nodes propose).
pub fn client_proposable(command: &Command) -> bool {
    !node_proposable(command)
}

/// Whether `command` is the bookkeeping a node proposes for the
/// connections it holds (their closing, their being alive): a follower
/// sends it to its leader.
pub fn node_proposable(command: &Command) -> bool {
    matches!(command, Command::Forget(_) | Command::Touch(_))
}

crate::area::area_commands!(
    torch, Torch, Set, CompareSet, Add, Append, DeleteKey, MultiSet, QueuePush, QueuePop, Wait,
    Barrier, CancelWait, Forget, Touch,
);
