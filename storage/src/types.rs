//! The openraft type configuration of coordstore: a log entry carries a batch
//! of journal updates (group commit), its response the outcomes in order.

use std::io::Cursor;
use std::sync::Arc;

use bytes::Bytes;

use journal::pb::{Outcome, UpdateBatch};
use prost::Message;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The payload of one Raft entry: every update the write batcher packed into
/// it. Serialised as the prost encoding of [`UpdateBatch`], which it keeps
/// beside the decoded batch: the batch is encoded once where it is proposed
/// and decoded once where it arrives, and writing it to the log or to a peer
/// copies those bytes. Clones share both.
///
/// A proposal whose encoding holds fields this build does not know (an
/// entry a newer build wrote) decodes, and says so ([`Proposal::unknown`]):
/// it must never be applied, in part or skipped, and the state machine
/// stops on it (`journal::known`).
#[derive(Clone, Debug, Default)]
pub struct Proposal {
    batch: Arc<UpdateBatch>,
    encoded: Bytes,
    /// What of the encoding this build does not know, if anything.
    unknown: Option<Arc<journal::NotKnown>>,
}

impl Proposal {
    /// A proposal of `batch` (encodes it). The batch kept is decoded from
    /// that encoding, as on a follower: the updates' byte strings of `batch`
    /// can be slices of larger buffers (a client's gRPC read buffer of 8 KiB
    /// behind each value of a few hundred bytes), which a proposal kept in
    /// the log's in-memory tail would keep alive.
    pub fn new(batch: UpdateBatch) -> Proposal {
        let encoded: Bytes = batch.encode_to_vec().into();
        match UpdateBatch::decode(encoded.clone()) {
            Ok(decoded) => Proposal {
                batch: Arc::new(decoded),
                encoded,
                unknown: None,
            },
            // Cannot happen (it was just encoded); keep the batch as given.
            Err(_) => Proposal {
                batch: Arc::new(batch),
                encoded,
                unknown: None,
            },
        }
    }

    /// Decodes a proposal from its prost encoding, noting any field this
    /// build does not know.
    pub fn decode(encoded: Bytes) -> Result<Proposal, prost::DecodeError> {
        let batch = UpdateBatch::decode(encoded.clone())?;
        let unknown = journal::known::check_known(&batch, &encoded)
            .err()
            .map(Arc::new);
        Ok(Proposal {
            batch: Arc::new(batch),
            encoded,
            unknown,
        })
    }

    /// What of this proposal's encoding this build does not know: `Some`
    /// for an entry a newer build wrote with a field or command this one
    /// cannot apply.
    pub fn unknown(&self) -> Option<&journal::NotKnown> {
        self.unknown.as_deref()
    }

    /// The journal feature level applying this proposal needs (its
    /// updates' highest).
    pub fn required_level(&self) -> u32 {
        self.batch
            .updates
            .iter()
            .map(journal::Update::required_level)
            .max()
            .unwrap_or(journal::LEVEL_BASE)
    }

    /// The updates.
    pub fn batch(&self) -> &UpdateBatch {
        &self.batch
    }

    /// Length of the encoding.
    pub fn encoded_len(&self) -> usize {
        self.encoded.len()
    }
}

impl PartialEq for Proposal {
    fn eq(&self, other: &Self) -> bool {
        self.encoded == other.encoded
    }
}

/// The outcomes of a [`Proposal`], one per update, in order. Empty for blank
/// and membership entries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcomes(pub Vec<Outcome>);

impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Proposal({} updates)", self.batch.updates.len())
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
        s.serialize_bytes(&self.encoded)
    }
}

impl<'de> Deserialize<'de> for Proposal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes: serde_bytes_compat::ByteBuf = Deserialize::deserialize(d)?;
        Proposal::decode(bytes.0.into()).map_err(serde::de::Error::custom)
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

/// coordstore's openraft type configuration: `declare_raft_types!`'s
/// defaults, but for the payload, the response and the responder.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq, Ord, PartialOrd)]
pub struct TypeConfig {}

impl openraft::RaftTypeConfig for TypeConfig {
    type D = Proposal;
    type R = Outcomes;
    type NodeId = u64;
    type Node = openraft::BasicNode;
    type Term = u64;
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<Self::Term, Self::NodeId>;
    type Vote = openraft::impls::Vote<Self::LeaderId>;
    type Payload = openraft::EntryPayload<Self::D, Self::NodeId, Self::Node>;
    type Entry =
        openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type Responder<T>
        = CallbackResponder<T>
    where
        T: openraft::OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: openraft::OptionalSend + 'static;
    // The macro's default; deprecated only as a path (its home is now the
    // openraft-rt-tokio crate, which openraft re-exports here).
    #[allow(deprecated)]
    type AsyncRuntime = openraft::impls::TokioRuntime;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// Where the outcome of a client write goes: a callback run where the entry
/// is applied (the state machine's task), with `Some(result)`, or with
/// `None` when openraft drops the write unanswered (shut down). Answering
/// there, not through a channel to a task that then answers, saves a hand-off
/// between tasks per write.
pub struct CallbackResponder<T> {
    callback: Option<Box<dyn FnOnce(Option<T>) + Send>>,
}

impl<T> CallbackResponder<T> {
    /// A responder that runs `callback` once.
    pub fn new(callback: impl FnOnce(Option<T>) + Send + 'static) -> Self {
        CallbackResponder {
            callback: Some(Box::new(callback)),
        }
    }
}

impl<T: openraft::OptionalSend + 'static> openraft::raft::responder::Responder<TypeConfig, T>
    for CallbackResponder<T>
{
    fn on_complete(mut self, result: T) {
        if let Some(f) = self.callback.take() {
            f(Some(result));
        }
    }
}

impl<T> Drop for CallbackResponder<T> {
    fn drop(&mut self) {
        if let Some(f) = self.callback.take() {
            f(None);
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use journal::pb::{coordination::KvInsert, update::Command as Cmd};

    #[test]
    fn a_proposal_is_stored_as_the_prost_encoding_of_its_batch() {
        let batch = UpdateBatch {
            updates: vec![journal::Update {
                command: Some(Cmd::from(KvInsert {
                    key: "k".into(),
                    value: b"v".to_vec().into(),
                    allow_overwrite: true,
                })),
                ..Default::default()
            }],
        };
        let p = Proposal::new(batch.clone());
        let stored = bincode::serialize(&p).unwrap();
        // bincode's bytes: a u64 length, then the bytes (the log format of
        // every earlier build).
        let prost = batch.encode_to_vec();
        assert_eq!(stored[..8], (prost.len() as u64).to_le_bytes());
        assert_eq!(stored[8..], prost[..]);
        let back: Proposal = bincode::deserialize(&stored).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.batch(), &batch);
        assert!(
            bincode::deserialize::<Proposal>(&[3, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff]).is_err()
        );
    }

    /// The client's buffer behind a value is not kept by the proposal: its
    /// batch is decoded from the proposal's own encoding.
    #[test]
    fn a_proposal_does_not_keep_the_buffers_its_values_came_from() {
        let client_buffer = Bytes::from(vec![1u8; 8192]);
        let batch = UpdateBatch {
            updates: vec![journal::Update {
                command: Some(Cmd::from(KvInsert {
                    key: "k".into(),
                    value: client_buffer.slice(0..300),
                    allow_overwrite: true,
                })),
                ..Default::default()
            }],
        };
        let p = Proposal::new(batch.clone());
        assert_eq!(p.batch(), &batch);
        let Some(Cmd::Coordination(c)) = &p.batch().updates[0].command else {
            panic!("not a coordination command");
        };
        let Some(journal::pb::coordination::command::Command::KvInsert(kv)) = &c.command else {
            panic!("not an insert");
        };
        assert!(!client_buffer.as_ptr_range().contains(&kv.value.as_ptr()));
        assert!(p.encoded.as_ptr_range().contains(&kv.value.as_ptr()));
    }

    #[test]
    fn a_responder_answers_once_and_a_dropped_one_answers_none() {
        use openraft::raft::responder::Responder;
        use std::sync::Mutex;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answered = {
            let seen = seen.clone();
            CallbackResponder::new(move |r: Option<u32>| seen.lock().unwrap().push(r))
        };
        Responder::<TypeConfig, u32>::on_complete(answered, 7);
        let dropped = {
            let seen = seen.clone();
            CallbackResponder::new(move |r: Option<u32>| seen.lock().unwrap().push(r))
        };
        drop(dropped);
        assert_eq!(*seen.lock().unwrap(), vec![Some(7), None]);
    }
}
