//! The openraft type configuration of coordstore: a log entry carries a batch
//! of journal updates (group commit), its response the outcomes in order.

use std::io::Cursor;

use journal::pb::{Outcome, UpdateBatch};
use prost::Message;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The payload of one Raft entry: every update the write batcher packed into
/// it. Serialised as the prost encoding of [`UpdateBatch`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposal(pub UpdateBatch);

/// The outcomes of a [`Proposal`], one per update, in order. Empty for blank
/// and membership entries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcomes(pub Vec<Outcome>);

impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Proposal({} updates)", self.0.updates.len())
    }
}

fn ser_prost<M: Message, S: Serializer>(m: &M, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(&m.encode_to_vec())
}

fn de_prost<'de, M: Message + Default, D: Deserializer<'de>>(d: D) -> Result<M, D::Error> {
    let bytes: serde_bytes_compat::ByteBuf = Deserialize::deserialize(d)?;
    M::decode(bytes.0.as_slice()).map_err(serde::de::Error::custom)
}

impl Serialize for Proposal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ser_prost(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for Proposal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de_prost(d).map(Proposal)
    }
}

impl Serialize for Outcomes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ser_prost(
            &journal::pb::OutcomeBatch {
                outcomes: self.0.clone(),
            },
            s,
        )
    }
}

impl<'de> Deserialize<'de> for Outcomes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de_prost::<journal::pb::OutcomeBatch, D>(d).map(|b| Outcomes(b.outcomes))
    }
}

/// A byte buffer that deserialises from serde bytes or a sequence of u8, so
/// self-describing and binary formats both work.
mod serde_bytes_compat {
    use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

    pub struct ByteBuf(pub Vec<u8>);

    impl<'de> Deserialize<'de> for ByteBuf {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = ByteBuf;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<ByteBuf, E> {
                    Ok(ByteBuf(v.to_vec()))
                }
                fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<ByteBuf, E> {
                    Ok(ByteBuf(v))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ByteBuf, A::Error> {
                    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                    while let Some(b) = seq.next_element::<u8>()? {
                        out.push(b);
                    }
                    Ok(ByteBuf(out))
                }
            }
            d.deserialize_byte_buf(V)
        }
    }
}

openraft::declare_raft_types!(
    /// coordstore's openraft type configuration.
    pub TypeConfig:
        D = Proposal,
        R = Outcomes,
        NodeId = u64,
        Node = openraft::BasicNode,
);

/// Node ids are u64.
pub type NodeId = u64;
/// A node's address record in the membership.
pub type Node = openraft::BasicNode;
/// A Raft log entry.
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// openraft's storage error for this config.
pub type StorageError = openraft::StorageError<TypeConfig>;
/// A log id.
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
/// A vote.
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// The leader id a log id carries (term and node).
pub type LeaderId = openraft::alias::CommittedLeaderIdOf<TypeConfig>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// Membership with the log id that stored it.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
/// What a snapshot carries: the encoded state.
pub type SnapshotData = Cursor<Vec<u8>>;
/// A snapshot with its metadata.
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
