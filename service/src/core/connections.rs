//! The node's connection bounds: most connections open at once on its
//! client ports, and in each namespace. The listener asks for a place for
//! every connection it accepts ([`Connections::hold`]) and closes one that
//! gets none; the place is given back when the connection closes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The connection bounds of a node: most connections at once on all its
/// client ports, and on each namespace's (0: no bound).
#[derive(Debug, Default)]
pub struct Connections {
    max_node: usize,
    max_namespace: usize,
    open: AtomicUsize,
    by_namespace: Mutex<HashMap<String, usize>>,
    refused_node: AtomicU64,
    refused_namespace: AtomicU64,
}

impl Connections {
    /// Bounds of `max_node` connections on the node and `max_namespace` on
    /// each namespace (0: none).
    pub fn new(max_node: usize, max_namespace: usize) -> Arc<Self> {
        Arc::new(Connections {
            max_node,
            max_namespace,
            ..Default::default()
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections refused so far: (at the node's bound, at a namespace's).
    pub fn refused(&self) -> (u64, u64) {
        (
            self.refused_node.load(Ordering::Relaxed),
            self.refused_namespace.load(Ordering::Relaxed),
        )
    }

    /// A place for a connection in `namespace`, or why there is none.
    pub fn hold(self: &Arc<Self>, namespace: &str) -> Result<Held, String> {
        let before = self.open.fetch_add(1, Ordering::Relaxed);
        if self.max_node > 0 && before >= self.max_node {
            self.open.fetch_sub(1, Ordering::Relaxed);
            self.refused_node.fetch_add(1, Ordering::Relaxed);
            return Err(format!(
                "{before} connections are open on this node, its bound (--max-connections {})",
                self.max_node
            ));
        }
        let mut by = self.by_namespace.lock().unwrap_or_else(|p| p.into_inner());
        let here = by.entry(namespace.to_string()).or_default();
        if self.max_namespace > 0 && *here >= self.max_namespace {
            let n = *here;
            drop(by);
            self.open.fetch_sub(1, Ordering::Relaxed);
            self.refused_namespace.fetch_add(1, Ordering::Relaxed);
            return Err(format!(
                "{n} connections are open in namespace {namespace} on this node, its bound \
                 (--max-connections-per-namespace {})",
                self.max_namespace
            ));
        }
        *here += 1;
        Ok(Held {
            conns: self.clone(),
            namespace: namespace.to_string(),
        })
    }
}

/// A connection's place, given back when it closes.
#[derive(Debug)]
pub struct Held {
    conns: Arc<Connections>,
    namespace: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.conns.open.fetch_sub(1, Ordering::Relaxed);
        let mut by = self
            .conns
            .by_namespace
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by.get_mut(&self.namespace) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.namespace);
            }
        }
    }
}
