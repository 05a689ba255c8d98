//! Journal feature levels: which updates and states a build can apply, and
//! which level each update, state and data dir needs.
//!
//! A cluster is upgraded node by node, so for a while nodes of two builds
//! apply one log. Every node must apply every entry in full, or their
//! states part without a word (prost drops what it does not know). Each
//! build therefore knows the level it applies ([`FEATURE_LEVEL`]), every
//! update the level it needs ([`Update::required_level`]), and the state
//! the level the cluster runs at ([`crate::State::feature_level`]): the
//! lowest level among its members, raised by the leader (`SetFeatureLevel`)
//! once every member has said it applies it, never lowered. The service
//! refuses to propose an update that needs more than the cluster's level,
//! and a node that still meets an entry it cannot fully decode stops
//! ([`crate::known`]).
//!
//! | level | what it added |
//! |---|---|
//! | 1 | one flat command set (data dirs of this format are refused) |
//! | 2 | per-area commands, replies and state: the builds up to the one before namespaces |
//! | 3 | namespaces (`Update.namespace`, CreateNamespace, DeleteNamespace, `StateData.namespaces`), and the cluster's level itself (SetFeatureLevel, `StateData.feature_level`) |
//! | 4 | the PyTorch store (its commands, `StateData.torch`, `NamespaceSpec.torch_plaintext`) |
//! | 5 | torchrun's rendezvous (its commands, `StateData.rendezvous`) |
//!
//! A data dir records the level its contents need as its journal format,
//! so a build of a lower level refuses to start on it (builds check the
//! format they read), and so do backups and namespace exports.

use crate::pb::update::Command;
use crate::pb::{NamespaceData, NamespaceSpec, StateData};
use crate::Update;

/// The per-area command set of the builds before namespaces: the level of
/// a cluster that has never raised its own.
pub const LEVEL_BASE: u32 = 2;
/// Namespaces, and the cluster's feature level.
pub const LEVEL_NAMESPACES: u32 = 3;
/// The PyTorch store: its commands and state, and a namespace's
/// `torch_plaintext`.
pub const LEVEL_TORCH: u32 = 4;
/// torchrun's rendezvous: its commands and state.
pub const LEVEL_RENDEZVOUS: u32 = 5;
/// The highest level this build applies.
pub const FEATURE_LEVEL: u32 = LEVEL_RENDEZVOUS;
/// The lowest data-dir format this build reads.
pub const OLDEST_FORMAT: u32 = LEVEL_BASE;

/// What level `level` added, for messages.
pub fn describe(level: u32) -> &'static str {
    match level {
        0..=1 => "the flat command set",
        LEVEL_BASE => "the builds before namespaces",
        LEVEL_NAMESPACES => "namespaces",
        LEVEL_TORCH => "the PyTorch store",
        LEVEL_RENDEZVOUS => "torchrun's rendezvous",
        _ => "a newer build than this one",
    }
}

impl Update {
    /// The journal feature level a node needs to apply this update in full.
    pub fn required_level(&self) -> u32 {
        let command = match &self.command {
            Some(Command::CreateNamespace(c)) => namespace_level(c.spec.as_ref(), c.data.as_ref()),
            Some(Command::DeleteNamespace(_)) => LEVEL_NAMESPACES,
            Some(Command::Torch(_)) => LEVEL_TORCH,
            Some(Command::Rendezvous(_)) => LEVEL_RENDEZVOUS,
            Some(Command::SetFeatureLevel(s)) => s.level.max(LEVEL_NAMESPACES),
            _ => LEVEL_BASE,
        };
        let namespace = if self.namespace.is_empty() {
            LEVEL_BASE
        } else {
            LEVEL_NAMESPACES
        };
        command.max(namespace)
    }
}

/// The level a namespace of settings `spec` and state `data` needs: the
/// rendezvous' when its state holds a rendezvous, the PyTorch store's when
/// either holds any of it (its state, a spec's `torch_plaintext`), else
/// namespaces'.
fn namespace_level(spec: Option<&NamespaceSpec>, data: Option<&NamespaceData>) -> u32 {
    let plaintext = |s: Option<&NamespaceSpec>| s.is_some_and(|s| s.torch_plaintext);
    let torch =
        plaintext(spec) || data.is_some_and(|d| d.torch.is_some() || plaintext(d.spec.as_ref()));
    if data.is_some_and(|d| d.rendezvous.is_some()) {
        LEVEL_RENDEZVOUS
    } else if torch {
        LEVEL_TORCH
    } else {
        LEVEL_NAMESPACES
    }
}

/// The level state `data` needs: the cluster's own, and what its
/// namespaces and the default namespace's PyTorch store hold.
pub(crate) fn state_level(data: &StateData) -> u32 {
    let namespaces = data
        .namespaces
        .values()
        .map(|n| namespace_level(None, Some(n)));
    let torch = if data.rendezvous.is_some() {
        LEVEL_RENDEZVOUS
    } else if data.torch.is_some() {
        LEVEL_TORCH
    } else {
        LEVEL_BASE
    };
    namespaces
        .fold(data.feature_level.max(torch), u32::max)
        .max(LEVEL_BASE)
}
