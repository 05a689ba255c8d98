//! Why is this PyTorch job stuck: what a namespace's store waits for. The
//! replicated state knows which connection waits on which key and what
//! each counter holds; only the node that holds a connection knows its
//! client's address and pid, since when it waits, which keys its clients
//! ADD to, and when they last wrote ([`crate::core::sessions`]). So the
//! view reads the state (after a read index, or as this node has it when no
//! leader answers in time) and asks every member for its own facts
//! (`NodePeer.StoreFacts`, [`MEMBER_WAIT`] each, in parallel); a member
//! that does not answer is named, and its connections show without ages.
//! Nothing here is leader state, and nothing adds a log entry. `ctl torch`,
//! the Node API's `StoreWaits` and the status page answer through here.

use std::collections::HashMap;
use std::time::Duration;

use proto::coordstore::node_peer_client::NodePeerClient;
use proto::coordstore::{
    StoreConnectionFacts, StoreCounter, StoreCounterFacts, StoreFactsRequest, StoreFactsResponse,
    StoreKeyWait, StoreNodeConnections, StoreWaiter, StoreWaitsRequest, StoreWaitsResponse,
};
use tonic::Status;

use crate::core::router::forward;
use crate::core::{Call, CallResult, Core};

/// Keys listed unless the caller asks for another number.
pub const KEY_LIMIT: usize = 100;
/// Waiters listed per key unless the caller asks for another number.
pub const WAITER_LIMIT: usize = 20;
/// How long the view waits for each member's facts, and for a read index.
pub const MEMBER_WAIT: Duration = Duration::from_millis(1500);
/// TCPStore's count of the clients that started (each client created with
/// a world size ADDs 1 to it): what a counter without a BARRIER's world
/// size is shown against.
pub const INIT_KEY: &str = "init/";

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// This node's own facts of `namespace`'s store (`NodePeer.StoreFacts`).
pub fn store_facts(core: &Core, namespace: &str) -> StoreFactsResponse {
    let f = core.store_sessions().of(namespace);
    StoreFactsResponse {
        node_id: core.node().id(),
        connections: f
            .sessions
            .into_iter()
            .map(|s| StoreConnectionFacts {
                connection: s.id,
                address: s.address,
                pid: s.pid,
                waited_ms: s.waited.map(ms),
                relayed: s.relayed,
            })
            .collect(),
        counters: f
            .counters
            .into_iter()
            .map(|c| StoreCounterFacts {
                key: c.key,
                adds: c.adds,
                last_add_ms: ms(c.since_last),
                world_size: c.world_size,
            })
            .collect(),
        last_write_age_ms: f.since_write.map(ms),
    }
}

/// Every member's facts, or why it gave none.
async fn members_facts(core: &Core, call: &Call) -> Vec<(u64, Result<StoreFactsResponse, String>)> {
    let node = core.node();
    let asks = node
        .members()
        .into_iter()
        .map(|(id, address, _)| async move {
            if id == node.id() {
                return (id, Ok(store_facts(core, call.namespace())));
            }
            let asked = async {
                let ch = node
                    .channels()
                    .get(id, &address)
                    .map_err(Status::unavailable)?;
                let max = core.router().max_message_bytes();
                NodePeerClient::new(ch)
                    .max_decoding_message_size(max)
                    .store_facts(forward(call, StoreFactsRequest {}))
                    .await
            };
            let answer = match tokio::time::timeout(MEMBER_WAIT, asked).await {
                Ok(Ok(r)) => Ok(r.into_inner()),
                Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                    Err("a build without StoreFacts".to_string())
                }
                Ok(Err(s)) => Err(format!("unreachable: {}", s.message())),
                Err(_) => Err(format!("no answer within {} ms", MEMBER_WAIT.as_millis())),
            };
            (id, answer)
        });
    futures_util::future::join_all(asks).await
}

/// What the call's namespace's store waits for (see the module).
pub async fn store_waits(
    core: &Core,
    call: &Call,
    r: StoreWaitsRequest,
) -> CallResult<StoreWaitsResponse> {
    // Up to date when a leader answers in time; else as this node has it.
    let _ = tokio::time::timeout(MEMBER_WAIT, core.linearizable(call)).await;
    let read_index = core.parking().applied_index();
    let facts = members_facts(core, call).await;
    let limit = |n: u32, default: usize| if n == 0 { default } else { n as usize };
    let (key_limit, waiter_limit) = (
        limit(r.key_limit, KEY_LIMIT),
        limit(r.waiter_limit, WAITER_LIMIT),
    );
    let view = core.read(call, |n| {
        let store = n.torch();
        let mut keys: Vec<(&String, Vec<u64>)> = store
            .waiters()
            .map(|(k, conns)| {
                let mut seen = std::collections::HashSet::new();
                let distinct = conns.iter().copied().filter(|c| seen.insert(*c)).collect();
                (k, distinct)
            })
            .collect();
        let keys_waited_on = keys.len() as u32;
        let held = store.held();
        let init = store
            .get(INIT_KEY)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok());
        (
            keys_waited_on,
            {
                keys.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(b.0)));
                keys.truncate(key_limit);
                keys.into_iter()
                    .map(|(k, c)| (k.clone(), c))
                    .collect::<Vec<_>>()
            },
            store.waiting_connections() as u32,
            held,
            init,
            counter_values(&store, &facts),
        )
    })?;
    let (keys_waited_on, keys, waiting_connections, held, init, values) = view;
    Ok(assemble(Assembly {
        node_id: core.node().id(),
        read_index,
        facts,
        keys,
        keys_waited_on,
        waiting_connections,
        init,
        values,
        waiter_limit,
        held: (held.keys, held.bytes),
    }))
}

/// The values of the counters the members know (`None`: no number now).
fn counter_values(
    store: &journal::torch::Reader<'_>,
    facts: &[(u64, Result<StoreFactsResponse, String>)],
) -> HashMap<String, Option<String>> {
    facts
        .iter()
        .filter_map(|(_, f)| f.as_ref().ok())
        .flat_map(|f| f.counters.iter())
        .map(|c| {
            let value = store
                .get(&c.key)
                .and_then(|v| std::str::from_utf8(v).ok())
                .filter(|v| v.parse::<i64>().is_ok())
                .map(str::to_string);
            (c.key.clone(), value)
        })
        .collect()
}

/// What [`assemble`] puts together.
struct Assembly {
    node_id: u64,
    read_index: u64,
    facts: Vec<(u64, Result<StoreFactsResponse, String>)>,
    /// The keys listed, each with its distinct waiting connections.
    keys: Vec<(String, Vec<u64>)>,
    keys_waited_on: u32,
    waiting_connections: u32,
    /// The value of [`INIT_KEY`], if a number.
    init: Option<i64>,
    values: HashMap<String, Option<String>>,
    waiter_limit: usize,
    held: (u64, u64),
}

/// The members' facts merged: each connection with its node, the
/// counters summed, the connections by node, the most recent write.
#[derive(Default)]
struct Merged<'a> {
    by_connection: HashMap<u64, (u64, &'a StoreConnectionFacts)>,
    counters: HashMap<&'a str, StoreCounter>,
    nodes: Vec<StoreNodeConnections>,
    last_write: Option<u64>,
}

fn merge(facts: &[(u64, Result<StoreFactsResponse, String>)]) -> Merged<'_> {
    let mut m = Merged::default();
    for (id, f) in facts {
        let f = match f {
            Ok(f) => f,
            Err(why) => {
                m.nodes.push(StoreNodeConnections {
                    node_id: *id,
                    error: why.clone(),
                    ..Default::default()
                });
                continue;
            }
        };
        for c in &f.connections {
            m.by_connection.insert(c.connection, (*id, c));
        }
        for c in &f.counters {
            let e = m.counters.entry(&c.key).or_insert_with(|| StoreCounter {
                key: c.key.clone(),
                ..Default::default()
            });
            e.adds += c.adds;
            e.last_add_ms = Some(
                e.last_add_ms
                    .map_or(c.last_add_ms, |t| t.min(c.last_add_ms)),
            );
            if c.world_size != 0 {
                e.of = c.world_size;
                e.of_from = "barrier".into();
            }
        }
        if let Some(w) = f.last_write_age_ms {
            m.last_write = Some(m.last_write.map_or(w, |l| l.min(w)));
        }
        let waiting = f
            .connections
            .iter()
            .filter(|c| c.waited_ms.is_some())
            .count();
        m.nodes.push(StoreNodeConnections {
            node_id: *id,
            connections: f.connections.len() as u32,
            waiting: waiting as u32,
            error: String::new(),
        });
    }
    m.nodes.sort_by_key(|n| n.node_id);
    m
}

/// A key and its distinct waiting connections, each named as its node
/// knows it (the first `limit`).
fn key_wait(m: &Merged<'_>, key: String, conns: &[u64], limit: usize) -> StoreKeyWait {
    let waiter = |c: &u64| match m.by_connection.get(c) {
        Some((node, f)) => StoreWaiter {
            connection: *c,
            node_id: *node,
            address: f.address.clone(),
            pid: f.pid,
            waited_ms: f.waited_ms,
        },
        None => StoreWaiter {
            connection: *c,
            ..Default::default()
        },
    };
    StoreKeyWait {
        waiting: conns.len() as u32,
        oldest_wait_ms: conns
            .iter()
            .filter_map(|c| m.by_connection.get(c)?.1.waited_ms)
            .max(),
        waiters: conns.iter().take(limit).map(waiter).collect(),
        key,
    }
}

/// The state's facts and the members' put together.
fn assemble(a: Assembly) -> StoreWaitsResponse {
    let m = merge(&a.facts);
    let keys = a
        .keys
        .into_iter()
        .map(|(key, conns)| key_wait(&m, key, &conns, a.waiter_limit))
        .collect();
    let mut counters: Vec<StoreCounter> = m
        .counters
        .into_values()
        .map(|mut c| {
            c.value = a.values.get(&c.key).cloned().flatten().unwrap_or_default();
            if c.of == 0 && c.key != INIT_KEY {
                if let Some(n) = a.init {
                    c.of = n;
                    c.of_from = INIT_KEY.into();
                }
            }
            c
        })
        .collect();
    counters.sort_by(|x, y| x.key.cmp(&y.key));
    StoreWaitsResponse {
        node_id: a.node_id,
        read_index: a.read_index,
        keys,
        keys_waited_on: a.keys_waited_on,
        waiting_connections: a.waiting_connections,
        counters,
        nodes: m.nodes,
        last_write_age_ms: m.last_write,
        stored_keys: a.held.0,
        stored_bytes: a.held.1,
    }
}

/// The view as JSON: what `ctl torch` prints and the status page shows.
/// Keys, addresses and counts only: no value but a counter's number.
pub fn to_json(r: &StoreWaitsResponse) -> serde_json::Value {
    use serde_json::json;
    let keys: Vec<_> = r
        .keys
        .iter()
        .map(|k| {
            let waiters: Vec<_> = k
                .waiters
                .iter()
                .map(|w| {
                    json!({
                        "connection": format!("{:016x}", w.connection),
                        "node_id": (w.node_id != 0).then_some(w.node_id),
                        "address": (!w.address.is_empty()).then_some(&w.address),
                        "pid": (w.pid != 0).then_some(w.pid),
                        "waited_ms": w.waited_ms,
                    })
                })
                .collect();
            json!({
                "key": k.key,
                "waiting": k.waiting,
                "oldest_wait_ms": k.oldest_wait_ms,
                "waiters": waiters,
            })
        })
        .collect();
    let counters: Vec<_> = r
        .counters
        .iter()
        .map(|c| {
            json!({
                "key": c.key,
                "value": c.value.parse::<i64>().ok(),
                "of": (c.of != 0).then_some(c.of),
                "of_from": (!c.of_from.is_empty()).then_some(&c.of_from),
                "adds": c.adds,
                "last_add_ms": c.last_add_ms,
            })
        })
        .collect();
    let nodes: Vec<_> = r
        .nodes
        .iter()
        .map(|n| {
            json!({
                "node_id": n.node_id,
                "connections": (n.error.is_empty()).then_some(n.connections),
                "waiting": (n.error.is_empty()).then_some(n.waiting),
                "error": (!n.error.is_empty()).then_some(&n.error),
            })
        })
        .collect();
    json!({
        "node_id": r.node_id,
        "read_index": r.read_index,
        "keys_waited_on": r.keys_waited_on,
        "waiting_connections": r.waiting_connections,
        "stored_keys": r.stored_keys,
        "stored_bytes": r.stored_bytes,
        "last_write_age_ms": r.last_write_age_ms,
        "keys": keys,
        "counters": counters,
        "nodes": nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(id: u64, address: &str, pid: u32, waited_ms: Option<u64>) -> StoreConnectionFacts {
        StoreConnectionFacts {
            connection: id,
            address: address.into(),
            pid,
            waited_ms,
            relayed: false,
        }
    }

    #[test]
    fn the_members_facts_name_each_keys_waiters_and_the_counters_target() {
        let node1 = StoreFactsResponse {
            node_id: 1,
            connections: vec![
                conn(10, "127.0.0.1:5001", 101, Some(4_000)),
                conn(11, "127.0.0.1:5002", 102, None),
            ],
            counters: vec![StoreCounterFacts {
                key: "barrier".into(),
                adds: 2,
                last_add_ms: 300,
                world_size: 0,
            }],
            last_write_age_ms: Some(300),
        };
        let node2 = StoreFactsResponse {
            node_id: 2,
            connections: vec![conn(20, "127.0.0.1:6001", 201, Some(9_000))],
            counters: vec![
                StoreCounterFacts {
                    key: "barrier".into(),
                    adds: 1,
                    last_add_ms: 100,
                    world_size: 0,
                },
                StoreCounterFacts {
                    key: "b2".into(),
                    adds: 1,
                    last_add_ms: 100,
                    world_size: 8,
                },
            ],
            last_write_age_ms: Some(100),
        };
        let values = HashMap::from([
            ("barrier".to_string(), Some("3".to_string())),
            ("b2".to_string(), None),
        ]);
        let r = assemble(Assembly {
            node_id: 1,
            read_index: 42,
            facts: vec![(1, Ok(node1)), (2, Ok(node2)), (3, Err("no answer".into()))],
            keys: vec![("nccl_id".into(), vec![10, 20, 30])],
            keys_waited_on: 1,
            waiting_connections: 3,
            init: Some(4),
            values,
            waiter_limit: 2,
            held: (5, 50),
        });
        let k = &r.keys[0];
        assert_eq!(
            (k.key.as_str(), k.waiting, k.oldest_wait_ms),
            ("nccl_id", 3, Some(9_000))
        );
        // The first 2 waiters, in registration order, each with its node.
        let w: Vec<_> = k
            .waiters
            .iter()
            .map(|w| (w.connection, w.node_id, w.pid))
            .collect();
        assert_eq!(w, vec![(10, 1, 101), (20, 2, 201)]);
        let c: Vec<_> = r
            .counters
            .iter()
            .map(|c| {
                (
                    c.key.as_str(),
                    c.value.as_str(),
                    c.adds,
                    c.of,
                    c.of_from.as_str(),
                )
            })
            .collect();
        assert_eq!(
            c,
            vec![("b2", "", 1, 8, "barrier"), ("barrier", "3", 3, 4, "init/")]
        );
        assert_eq!(r.counters[1].last_add_ms, Some(100));
        assert_eq!(r.last_write_age_ms, Some(100));
        let n: Vec<_> = r
            .nodes
            .iter()
            .map(|n| (n.node_id, n.connections, n.waiting, n.error.is_empty()))
            .collect();
        assert_eq!(n, vec![(1, 2, 1, true), (2, 1, 1, true), (3, 0, 0, false)]);
    }
}
