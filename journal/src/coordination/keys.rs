//! Key normalisation of the KV store (`docs/protocols.md`, Key-value store):
//! runs of `/` collapse and leading and trailing `/` are dropped, so
//! `///a//b/` and `a/b` are one key.

/// Returns the normalised form of `key`.
pub fn normalize_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for part in key.split('/').filter(|p| !p.is_empty()) {
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(part);
    }
    out
}

/// The prefix every key under directory `dir` starts with (`dir` normalised
/// plus `/`), or `None` for the empty directory, which holds nothing.
pub(crate) fn dir_prefix(dir: &str) -> Option<String> {
    let d = normalize_key(dir);
    if d.is_empty() {
        None
    } else {
        Some(d + "/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_and_trims_slashes() {
        assert_eq!(normalize_key("///a//b/"), "a/b");
        assert_eq!(normalize_key("a/b"), "a/b");
        assert_eq!(normalize_key(""), "");
        assert_eq!(normalize_key("///"), "");
        assert_eq!(normalize_key("x"), "x");
    }

    #[test]
    fn dir_prefix_of_empty_is_none() {
        assert_eq!(dir_prefix(""), None);
        assert_eq!(dir_prefix("/d//"), Some("d/".to_string()));
    }
}
