//! torch's order of node descriptors (`_NodeDesc` is an ordered dataclass
//! of address, pid and local id), and sorted lists of agents in it.

use std::cmp::Ordering;

use super::Node;

fn cmp(a: &Node, b: &Node) -> Ordering {
    (a.addr.as_str(), a.pid, a.local_id).cmp(&(b.addr.as_str(), b.pid, b.local_id))
}

/// `node`'s position in sorted `list`, or where it would go.
pub fn find(list: &[Node], node: &Node) -> Result<usize, usize> {
    list.binary_search_by(|n| cmp(n, node))
}

/// Puts `node` into sorted `list`; whether it was not there.
pub fn insert(list: &mut Vec<Node>, node: &Node) -> bool {
    match find(list, node) {
        Ok(_) => false,
        Err(at) => {
            list.insert(at, node.clone());
            true
        }
    }
}

/// Takes `node` out of sorted `list`; whether it was there.
pub fn remove(list: &mut Vec<Node>, node: &Node) -> bool {
    match find(list, node) {
        Ok(at) => {
            list.remove(at);
            true
        }
        Err(_) => false,
    }
}

/// Whether `list` is sorted without repeats.
pub(super) fn strictly_sorted(list: &[Node]) -> bool {
    list.windows(2).all(|w| cmp(&w[0], &w[1]) == Ordering::Less)
}
