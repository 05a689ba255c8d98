//! Fail-stop, never skip: an entry holding a field or a command this build
//! does not know (what a newer build writes) is never applied in part nor
//! skipped. The state machine refuses the run of entries that holds it,
//! naming the entry's index and the field, so openraft stops the node; the
//! state is then exactly the state of the entries before it. A snapshot or
//! a data dir of a higher level is refused the same way.

use std::path::Path;

use bytes::Bytes;
use journal::pb::{coordination::KvInsert, update::Command, UpdateBatch};
use journal::{State, Update};
use openraft::storage::RaftStateMachine;
use openraft::EntryPayload;
use proptest::prelude::*;
use prost::Message;
use storage::{Entry, Identity, LeaderId, LogId, Proposal};
use tempfile::TempDir;

fn id() -> Identity {
    Identity {
        cluster_id: "c1".into(),
        node_id: 1,
    }
}

fn stream(
    entries: Vec<Entry>,
) -> impl futures_util::Stream<
    Item = std::io::Result<openraft::storage::EntryResponder<storage::TypeConfig>>,
> + Unpin {
    futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))))
}

fn insert(key: &str) -> Update {
    Update {
        command: Some(Command::from(KvInsert {
            key: key.into(),
            value: "v".into(),
            allow_overwrite: true,
        })),
        ..Default::default()
    }
}

fn entry(index: u64, proposal: Proposal) -> Entry {
    Entry {
        log_id: LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(proposal),
    }
}

/// A field this build does not know, where it sits, and its wire bytes.
#[derive(Clone, Debug)]
struct Stranger {
    /// Top level of the update (a new command or field), or inside its
    /// KvInsert (a new field of a command).
    nested: bool,
    number: u32,
    wire_type: u8,
}

impl Stranger {
    /// The field's key and a value of its wire type.
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let key = (u64::from(self.number) << 3) | u64::from(self.wire_type);
        prost::encoding::encode_varint(key, &mut out);
        match self.wire_type {
            0 => prost::encoding::encode_varint(300, &mut out),
            1 => out.extend_from_slice(&7u64.to_le_bytes()),
            2 => {
                // An embedded message, as a new command would be.
                let inner = KvInsert {
                    key: "x".into(),
                    ..Default::default()
                }
                .encode_to_vec();
                prost::encoding::encode_varint(inner.len() as u64, &mut out);
                out.extend_from_slice(&inner);
            }
            _ => out.extend_from_slice(&9u32.to_le_bytes()),
        }
        out
    }
}

/// The encoding of a batch of one `update`, carrying `stranger`.
fn with_stranger(update: &Update, stranger: &Stranger) -> Bytes {
    let mut encoded = if stranger.nested {
        // Update { command: Coordination(Command { KvInsert { .. +field } }) }
        let Some(Command::Coordination(c)) = &update.command else {
            unreachable!("an insert")
        };
        let Some(journal::pb::coordination::command::Command::KvInsert(kv)) = &c.command else {
            unreachable!("an insert")
        };
        let mut kv_bytes = kv.encode_to_vec();
        kv_bytes.extend(stranger.bytes());
        let coordination = wrap(KV_INSERT_FIELD, &kv_bytes);
        wrap(COORDINATION_FIELD, &coordination)
    } else {
        let mut u = update.encode_to_vec();
        u.extend(stranger.bytes());
        u
    };
    encoded = wrap(1, &encoded); // UpdateBatch.updates
    Bytes::from(encoded)
}

/// `Update.coordination` and `coordination.Command.kv_insert`.
const COORDINATION_FIELD: u32 = 20;
const KV_INSERT_FIELD: u32 = 8;

/// A length-delimited field `number` holding `bytes`.
fn wrap(number: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

fn stranger() -> impl Strategy<Value = Stranger> {
    (
        any::<bool>(),
        16u32..5000,
        prop::sample::select(vec![0u8, 1, 2, 5]),
    )
        .prop_filter_map(
            "a field number this build knows",
            |(nested, number, wire_type)| {
                let s = Stranger {
                    nested,
                    number,
                    wire_type,
                };
                let bytes = with_stranger(&insert("k"), &s);
                let unknown =
                    journal::known::unknown_fields(".coordstore.journal.UpdateBatch", &bytes);
                (!unknown.is_empty()).then_some(s)
            },
        )
}

/// Prost itself drops the stranger: decoded and applied as it is, the
/// update would be applied in part (a new field of a command) or not at all
/// (a new command decodes as none). That is what this test guards against.
#[test]
fn prost_drops_what_it_does_not_know() {
    let u = insert("k");
    let top = Stranger {
        nested: false,
        number: 57,
        wire_type: 2,
    };
    let batch = UpdateBatch::decode(with_stranger(&u, &top)).unwrap();
    assert_eq!(batch.updates, vec![u.clone()], "the new command vanished");
    let nested = Stranger {
        nested: true,
        number: 9,
        wire_type: 0,
    };
    let bytes = with_stranger(&u, &nested);
    let batch = UpdateBatch::decode(bytes.clone()).unwrap();
    assert_eq!(batch.updates, vec![u], "the new field vanished");
    // Decoded here it is named.
    let p = Proposal::decode(bytes).unwrap();
    let why = p.unknown().expect("noticed").to_string();
    assert!(
        why.contains("UpdateBatch.updates.coordination.kv_insert: field 9"),
        "{why}"
    );
}

/// Applies `entries` in runs of `run` to a fresh state machine in `dir`,
/// stopping at the first refused run: the error, if any.
async fn apply_in_runs(dir: &Path, entries: &[Entry], run: usize) -> (Option<String>, State, u64) {
    let (log, mut sm) = storage::open(dir, 8 << 20, &id()).unwrap();
    let mut error = None;
    for chunk in entries.chunks(run) {
        if let Err(e) = sm.apply(stream(chunk.to_vec())).await {
            error = Some(e.to_string());
            break;
        }
    }
    let (applied, _) = sm.applied_state().await.unwrap();
    let state = sm.handle().read(|s| s.clone());
    drop((log, sm));
    (error, state, applied.map_or(0, |l| l.index))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Wherever the entry with the unknown field sits, and however the
    /// entries are handed to the state machine, it stops there: the error
    /// names the entry's index and the field, and the state is the state of
    /// the entries before it.
    #[test]
    fn an_entry_this_build_cannot_read_stops_the_node_instead_of_being_skipped(
        keys in prop::collection::vec("[a-c]{1,3}", 2..12),
        at in 0usize..12,
        run in 1usize..5,
        stranger in stranger(),
    ) {
        let at = at % keys.len();
        let entries: Vec<Entry> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let u = insert(k);
                let proposal = if i == at {
                    Proposal::decode(with_stranger(&u, &stranger)).unwrap()
                } else {
                    Proposal::new(UpdateBatch { updates: vec![u] })
                };
                entry(i as u64 + 1, proposal)
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = TempDir::new().unwrap();
        let (error, state, applied) = rt.block_on(apply_in_runs(dir.path(), &entries, run));
        let error = error.expect("the run holding the entry is refused");
        let index = at + 1;
        prop_assert!(error.contains(&format!("log entry {index} cannot be applied in full")), "{}", error);
        prop_assert!(error.contains(&format!("field {}", stranger.number)), "{}", error);
        // Exactly the entries before it, whatever the runs.
        let mut want = State::new();
        for k in &keys[..at] {
            want.apply(&insert(k));
        }
        prop_assert_eq!(state.digest_hex(), want.digest_hex());
        prop_assert!(applied < index as u64);
    }
}

/// The level of an update above this build's (a newer build's
/// SetFeatureLevel) stops the node the same way.
#[tokio::test]
async fn an_update_of_a_higher_level_stops_the_node() {
    let dir = TempDir::new().unwrap();
    let raise = Update::from(Command::SetFeatureLevel(journal::pb::SetFeatureLevel {
        level: journal::FEATURE_LEVEL + 1,
    }));
    let entries = vec![
        entry(
            1,
            Proposal::new(UpdateBatch {
                updates: vec![insert("a")],
            }),
        ),
        entry(
            2,
            Proposal::new(UpdateBatch {
                updates: vec![raise],
            }),
        ),
    ];
    let (error, state, applied) = apply_in_runs(dir.path(), &entries, 2).await;
    let error = error.unwrap();
    assert!(
        error.contains(
            "log entry 2 cannot be applied: its SetFeatureLevel needs journal feature level"
        ),
        "{error}"
    );
    assert_eq!((state.feature_level(), applied), (journal::LEVEL_BASE, 1));
}

/// What the data dir records as its journal format follows what it holds:
/// the base level while it holds nothing more, then the level of the first
/// entry appended that needs more, before that entry is on disk.
#[tokio::test]
async fn the_data_dir_records_the_level_of_what_it_holds_before_it_holds_it() {
    let dir = TempDir::new().unwrap();
    let format = |dir: &Path| {
        let db = sled::open(dir).unwrap();
        let raw = db
            .open_tree("meta")
            .unwrap()
            .get("journal_format")
            .unwrap()
            .unwrap();
        std::str::from_utf8(&raw).unwrap().parse::<u32>().unwrap()
    };
    let in_ns = Update {
        namespace: "job-a".into(),
        ..insert("k")
    };
    {
        let (log, _sm) = storage::open(dir.path(), 8 << 20, &id()).unwrap();
        log.write_entries(vec![entry(
            1,
            Proposal::new(UpdateBatch {
                updates: vec![insert("a")],
            }),
        )])
        .await
        .unwrap();
    }
    assert_eq!(format(dir.path()), journal::LEVEL_BASE);
    {
        let (log, _sm) = storage::open(dir.path(), 8 << 20, &id()).unwrap();
        log.write_entries(vec![entry(
            2,
            Proposal::new(UpdateBatch {
                updates: vec![in_ns],
            }),
        )])
        .await
        .unwrap();
    }
    assert_eq!(format(dir.path()), journal::LEVEL_NAMESPACES);
    // A snapshot of a higher level than this build's does not load.
    let mut data =
        journal::pb::StateData::decode(State::new().encode_snapshot().as_slice()).unwrap();
    data.feature_level = journal::FEATURE_LEVEL + 1;
    let e = State::decode_snapshot(&data.encode_to_vec())
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs journal feature level"), "{e}");
    // Nor does one holding a field this build does not know.
    let mut bytes = State::new().encode_snapshot();
    bytes.extend(wrap(77, b"new"));
    let e = State::decode_snapshot(&bytes).unwrap_err().to_string();
    assert!(e.contains("StateData: field 77"), "{e}");
}
