//! Namespace names: how the state keys a namespace, how messages name it,
//! and which names are valid. A leaf every other module may use (the
//! cluster view names its namespace in messages).

/// The namespace a call without one acts in.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Longest namespace name (a DNS label).
pub const MAX_NAME_LEN: usize = 63;

/// How the state keys a namespace: "" for the default one (however it is
/// written), the name for the others.
pub fn namespace_key(name: &str) -> &str {
    if name == DEFAULT_NAMESPACE {
        ""
    } else {
        name
    }
}

/// How messages name a namespace: `default` for the default one.
pub fn namespace_name(key: &str) -> &str {
    if key.is_empty() {
        DEFAULT_NAMESPACE
    } else {
        key
    }
}

/// Whether `name` is a valid namespace name: a DNS label,
/// `[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?`.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && inner(&b[0])
        && inner(&b[b.len() - 1])
        && b.iter().all(|c| inner(c) || *c == b'-')
}
