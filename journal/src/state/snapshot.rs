//! Snapshots (the prost encoding of the whole state), the digest, the
//! journal feature level a state needs, and the state's invariants.

use super::*;

impl State {
    /// Checks every invariant of the state: the shared part's and each
    /// area's ([`Area::check_invariants`]). `Err` names the broken rule. Run
    /// after every apply in debug builds, and by the property tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.feature_level() > crate::FEATURE_LEVEL {
            return Err(format!(
                "the state needs journal feature level {}, above this build's {}",
                self.feature_level(),
                crate::FEATURE_LEVEL
            ));
        }
        if let Some(c) = &self.data.config {
            check_config(c).map_err(|e| e.message)?;
        }
        if !self.data.initialized && (self.data.config.is_some() || self.data.epoch > 0) {
            return Err("a configuration or job epoch before the service is configured".into());
        }
        for (id, s) in &self.data.sessions {
            if s.outcomes
                .keys()
                .next()
                .is_some_and(|&seq| seq < s.done_below)
            {
                return Err(format!(
                    "client {id} keeps an outcome below what it declared done"
                ));
            }
        }
        if self.session_lru != session_lru(&self.data.sessions) {
            return Err("the sessions' recency index does not match the sessions".into());
        }
        let mut ports = std::collections::BTreeMap::new();
        for n in self.namespaces() {
            let cl = n.cluster();
            let name = n.name();
            let named = |e: String| format!("namespace {name}: {e}");
            if !n.is_default() {
                if !namespace::valid_name(name) || !n.initialized {
                    return Err(named("an invalid or unconfigured namespace".into()));
                }
                if let Some(c) = n.config {
                    check_config(c).map_err(|e| named(e.message))?;
                }
                let port = n.spec.map_or(0, |s| s.port);
                if port != 0 {
                    if let Some(other) = ports.insert(port, name) {
                        return Err(format!("namespaces {other} and {name} share port {port}"));
                    }
                }
            }
            n.coordination.check_invariants(cl).map_err(named)?;
            let counted = coordination::kv_bytes(n.coordination);
            if n.kv_bytes != counted {
                return Err(named(format!(
                    "the store counts {} bytes of keys and values and holds {counted}",
                    n.kv_bytes
                )));
            }
            n.dispatcher.check_invariants(cl).map_err(named)?;
            n.closures.check_invariants(cl).map_err(named)?;
            if let Some(t) = n.torch {
                t.check_invariants(cl).map_err(named)?;
            }
            if let Some(r) = n.rendezvous {
                r.check_invariants(cl).map_err(named)?;
            }
        }
        Ok(())
    }

    /// Encodes the whole state (the snapshot format).
    pub fn encode_snapshot(&self) -> Vec<u8> {
        self.data.encode_to_vec()
    }

    /// The length of [`State::encode_snapshot`]'s encoding.
    pub fn snapshot_len(&self) -> usize {
        self.data.encoded_len()
    }

    /// Writes [`State::encode_snapshot`]'s encoding into `buf` piece by
    /// piece (a buffer that passes it on, so the whole encoding never needs
    /// to be in memory at once).
    /// Fails only if `buf` has less room than [`State::snapshot_len`].
    pub fn encode_snapshot_into(
        &self,
        buf: &mut impl bytes::BufMut,
    ) -> Result<(), prost::EncodeError> {
        self.data.encode(buf)
    }

    /// Decodes a snapshot produced by [`State::encode_snapshot`], and checks
    /// it: the configuration, and each area's part against it.
    ///
    /// A snapshot holding a field this build does not know, or a state that
    /// needs a higher journal feature level than this build applies, is
    /// refused (see [`crate::known`], [`crate::level`]): it is never read in
    /// part.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let mut data =
            crate::decode_known::<StateData>(bytes).map_err(|e| SnapshotError(e.to_string()))?;
        let needs = crate::level::state_level(&data);
        if needs > crate::FEATURE_LEVEL {
            return Err(SnapshotError(format!(
                "the state needs journal feature level {needs}, and this build applies up to {}",
                crate::FEATURE_LEVEL
            )));
        }
        let c = data.coordination.get_or_insert_with(Default::default);
        let default_kv_bytes = coordination::kv_bytes(c);
        let mut kv_bytes = BTreeMap::new();
        data.dispatcher.get_or_insert_with(Default::default);
        data.closures.get_or_insert_with(Default::default);
        if let Some(c) = &data.config {
            check_config(c).map_err(|e| SnapshotError(e.message))?;
        }
        for (name, n) in &mut data.namespaces {
            let c = n.coordination.get_or_insert_with(Default::default);
            kv_bytes.insert(name.clone(), coordination::kv_bytes(c));
            n.dispatcher.get_or_insert_with(Default::default);
            n.closures.get_or_insert_with(Default::default);
            check_namespace(name, n).map_err(SnapshotError)?;
        }
        let session_lru = session_lru(&data.sessions);
        let s = State {
            data,
            default_kv_bytes,
            kv_bytes,
            session_lru,
        };
        for n in s.namespaces() {
            let cl = n.cluster();
            let named = |e: String| SnapshotError(format!("namespace {}: {e}", n.name()));
            n.coordination.check_snapshot(cl).map_err(named)?;
            n.dispatcher.check_snapshot(cl).map_err(named)?;
            n.closures.check_snapshot(cl).map_err(named)?;
            if let Some(t) = n.torch {
                t.check_snapshot(cl).map_err(named)?;
            }
            if let Some(r) = n.rendezvous {
                r.check_snapshot(cl).map_err(named)?;
            }
        }
        Ok(s)
    }

    /// The journal feature level the cluster runs at (see
    /// [`crate::level`]): the level the leader last raised it to (the
    /// lowest its members apply), or the level of what the state already
    /// holds if that is higher — a state with namespaces was written by
    /// members that apply them, before the cluster had a level of its own.
    /// It is also the level a node needs to hold this state.
    pub fn feature_level(&self) -> u32 {
        crate::level::state_level(&self.data)
    }

    /// The level the leader last raised the cluster to
    /// ([`crate::pb::SetFeatureLevel`]), or the base level.
    pub fn raised_level(&self) -> u32 {
        self.data.feature_level.max(crate::LEVEL_BASE)
    }

    /// The leader clock: the newest update time applied.
    pub fn clock_ms(&self) -> u64 {
        self.data.clock_ms
    }

    /// SHA-256 of the canonical encoding: equal states have equal digests.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.encode_snapshot()).into()
    }

    /// The digest as lowercase hex.
    pub fn digest_hex(&self) -> String {
        self.digest().iter().map(|b| format!("{b:02x}")).collect()
    }
}
