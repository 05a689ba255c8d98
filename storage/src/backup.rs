//! Backups: a consistent copy of the state in one file (`coordstore ctl
//! snapshot save`), and seeding a new cluster's data dirs from it
//! (`coordstore restore`), as `etcdctl snapshot save` / `etcdutl snapshot
//! restore` do.
//!
//! The file: the line `COORDSTORE-BACKUP 1`, one line of JSON ([`Header`]:
//! log index, journal format, source cluster, size, SHA-256 of the data and
//! the state digest), then the encoded state (`journal::State`'s snapshot
//! encoding). Reading it checks all of them.
//!
//! A restored data dir holds that state as its snapshot, at the saved index,
//! with the new cluster's membership and a new cluster id; its log is empty
//! and its vote unset. Every member is restored from the same file with the
//! same member list, so they agree on the snapshot's log id and elect a
//! leader without an `initialize`; the log continues after the saved index.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use journal::State;
use openraft::{BasicNode, Membership};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::{Backend, DiskBackend, Identity, OpenError};
use crate::fs::sync_parent;
use crate::log_store::encode;
use crate::types::{LeaderId, LogId, NodeId, SnapshotMeta, StoredMembership};

/// First line of a backup file.
const MAGIC: &[u8] = b"COORDSTORE-BACKUP 1\n";

/// What a backup file says about the state it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The log index the state was read at (every write acknowledged before
    /// the save began is at or below it).
    pub index: u64,
    /// The journal format of the encoded state.
    pub format: u32,
    /// The cluster it was saved from.
    pub cluster_id: String,
    /// Bytes of encoded state.
    pub size: u64,
    /// SHA-256 of the encoded state, hex.
    pub sha256: String,
    /// `journal::State::digest_hex` of the state.
    pub state_digest: String,
    /// When it was saved (ms since the epoch, the saving host's clock).
    pub saved_at_ms: u64,
}

/// A backup: its header and the encoded state.
#[derive(Clone, Debug)]
pub struct Backup {
    /// What the file says about the state.
    pub header: Header,
    /// The encoded state.
    pub data: Vec<u8>,
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

impl Backup {
    /// A backup of `data` (a state encoding) read at `index` from
    /// `cluster_id`; fails if `data` is not a state this build can read.
    pub fn new(
        data: Vec<u8>,
        index: u64,
        cluster_id: &str,
        saved_at_ms: u64,
    ) -> Result<Backup, String> {
        let state = State::decode_snapshot(&data)
            .map_err(|e| format!("the state read from the cluster does not decode: {e}"))?;
        Ok(Backup {
            header: Header {
                index,
                // The level the state needs: a build of a lower one refuses
                // to restore it.
                format: state.feature_level(),
                cluster_id: cluster_id.to_string(),
                size: data.len() as u64,
                sha256: sha256_hex(&data),
                state_digest: state.digest_hex(),
                saved_at_ms,
            },
            data,
        })
    }

    /// Writes the file durably: a temporary file beside `path`, synced, then
    /// renamed over it and the directory synced.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let name = path
            .file_name()
            .ok_or_else(|| std::io::Error::other("the path names no file"))?;
        let mut tmp_name = name.to_os_string();
        tmp_name.push(".tmp");
        let tmp = path.with_file_name(tmp_name);
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&self.encode()?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_parent(path)
    }

    /// The file's bytes.
    fn encode(&self) -> std::io::Result<Vec<u8>> {
        frame(&self.header, &self.data).map_err(std::io::Error::other)
    }

    /// Reads and checks a backup file: its form, size, checksum, journal
    /// format, and that the state decodes to the digest it names.
    pub fn read(path: &Path) -> Result<Backup, String> {
        let raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(raw).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn parse(raw: Vec<u8>) -> Result<Backup, String> {
        let (header, data) = unframe::<Header>(raw)?;
        let state =
            State::decode_snapshot(&data).map_err(|e| format!("the state does not decode: {e}"))?;
        let digest = state.digest_hex();
        if digest != header.state_digest {
            return Err(format!(
                "the state's digest is {digest}, the header says {}",
                header.state_digest
            ));
        }
        Ok(Backup { header, data })
    }
}

/// First line of a namespace export file.
const EXPORT_MAGIC: &[u8] = b"COORDSTORE-NAMESPACE 1\n";

/// What a namespace export file says about the namespace it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportHeader {
    /// The namespace's name in the cluster it came from.
    pub name: String,
    /// The log index it was read at.
    pub index: u64,
    /// The journal format of the encoded namespace.
    pub format: u32,
    /// The cluster it was exported from.
    pub cluster_id: String,
    /// Bytes of encoded namespace.
    pub size: u64,
    /// SHA-256 of the encoded namespace, hex.
    pub sha256: String,
    /// When it was exported (ms since the epoch, the exporting node's clock).
    pub saved_at_ms: u64,
}

/// One namespace moved between clusters (`coordstore ctl ns export` /
/// `import`): the line `COORDSTORE-NAMESPACE 1`, one line of JSON
/// ([`ExportHeader`]), then the namespace's encoded state (a
/// `journal::pb::NamespaceData`). Reading it checks the form, the size, the
/// checksum, the format and that the namespace decodes.
#[derive(Clone, Debug)]
pub struct Export {
    /// What the file says about the namespace.
    pub header: ExportHeader,
    /// The encoded `NamespaceData`.
    pub data: Vec<u8>,
}

impl Export {
    /// An export of `data` (an encoded `NamespaceData`) named `name`, read
    /// at `index` of `cluster_id`.
    pub fn new(name: &str, data: Vec<u8>, index: u64, cluster_id: &str, saved_at_ms: u64) -> Self {
        Export {
            header: ExportHeader {
                name: name.to_string(),
                index,
                // Only a build that has namespaces imports one.
                format: journal::LEVEL_NAMESPACES,
                cluster_id: cluster_id.to_string(),
                size: data.len() as u64,
                sha256: sha256_hex(&data),
                saved_at_ms,
            },
            data,
        }
    }

    /// The file's bytes.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        frame(&self.header, &self.data)
    }

    /// Reads and checks an export file's bytes; the namespace's state.
    pub fn parse(raw: Vec<u8>) -> Result<(Export, journal::pb::NamespaceData), String> {
        let (header, data) = unframe::<ExportHeader>(raw)?;
        let ns = journal::decode_known::<journal::pb::NamespaceData>(&data)
            .map_err(|e| format!("the namespace cannot be read: {e}"))?;
        Ok((Export { header, data }, ns))
    }
}

/// The header of a framed file (a backup's, an export's): what the checks
/// every framed file gets read of it.
trait FrameHeader: Serialize + serde::de::DeserializeOwned {
    /// The file's first line.
    const MAGIC: &'static [u8];
    /// What the file is, for errors: "coordstore backup".
    const KIND: &'static str;
    /// What its data is, for errors: "state".
    const DATA: &'static str;
    fn size(&self) -> u64;
    fn sha256(&self) -> &str;
    fn format(&self) -> u32;
}

impl FrameHeader for Header {
    const MAGIC: &'static [u8] = MAGIC;
    const KIND: &'static str = "coordstore backup";
    const DATA: &'static str = "state";
    fn size(&self) -> u64 {
        self.size
    }
    fn sha256(&self) -> &str {
        &self.sha256
    }
    fn format(&self) -> u32 {
        self.format
    }
}

impl FrameHeader for ExportHeader {
    const MAGIC: &'static [u8] = EXPORT_MAGIC;
    const KIND: &'static str = "coordstore namespace export";
    const DATA: &'static str = "namespace";
    fn size(&self) -> u64 {
        self.size
    }
    fn sha256(&self) -> &str {
        &self.sha256
    }
    fn format(&self) -> u32 {
        self.format
    }
}

/// A framed file's bytes: the magic line, the header as one line of JSON,
/// the data.
fn frame<H: FrameHeader>(header: &H, data: &[u8]) -> Result<Vec<u8>, String> {
    let head = serde_json::to_vec(header).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(H::MAGIC.len() + head.len() + 1 + data.len());
    out.extend_from_slice(H::MAGIC);
    out.extend_from_slice(&head);
    out.push(b'\n');
    out.extend_from_slice(data);
    Ok(out)
}

/// Reads a framed file's bytes, checking its form, its size, its checksum
/// and its journal format; its header and data.
fn unframe<H: FrameHeader>(mut raw: Vec<u8>) -> Result<(H, Vec<u8>), String> {
    if !raw.starts_with(H::MAGIC) {
        let line = String::from_utf8_lossy(&H::MAGIC[..H::MAGIC.len() - 1]).into_owned();
        return Err(format!("not a {} (no {line} line)", H::KIND));
    }
    let rest = &raw[H::MAGIC.len()..];
    let eol = rest
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("the header line is cut off (truncated file)")?;
    let header: H = serde_json::from_slice(&rest[..eol])
        .map_err(|e| format!("the header is corrupted: {e}"))?;
    let start = H::MAGIC.len() + eol + 1;
    let have = (raw.len() - start) as u64;
    if have != header.size() {
        return Err(format!(
            "the file holds {have} bytes of {}, its header says {} (truncated or corrupted)",
            H::DATA,
            header.size()
        ));
    }
    let data = raw.split_off(start);
    let sum = sha256_hex(&data);
    if sum != header.sha256() {
        return Err(format!(
            "checksum mismatch: the {}'s SHA-256 is {sum}, the header says {} (corrupted)",
            H::DATA,
            header.sha256()
        ));
    }
    check_format(header.format())?;
    Ok((header, data))
}

/// A file of journal format `format` is one this build reads (a format is
/// the journal feature level the file's state needs).
fn check_format(format: u32) -> Result<(), String> {
    if (journal::OLDEST_FORMAT..=journal::FEATURE_LEVEL).contains(&format) {
        return Ok(());
    }
    Err(format!(
        "it holds journal format {format} ({}), and this coordstore reads formats {} to {}",
        journal::level::describe(format),
        journal::OLDEST_FORMAT,
        journal::FEATURE_LEVEL
    ))
}

/// Seeds the data dir of node `identity.node_id` of a new cluster
/// (`identity.cluster_id`, which must differ from the backup's) whose
/// voting members are `members` (id → address): the backup's state becomes
/// the dir's snapshot at the saved index. The dir must not exist or be
/// empty. Returns the snapshot's log id.
pub fn restore(
    dir: &Path,
    identity: &Identity,
    backup: &Backup,
    members: &BTreeMap<NodeId, String>,
) -> Result<LogId, OpenError> {
    let refuse = |reason: String| OpenError::new(dir, reason);
    if !members.contains_key(&identity.node_id) {
        return Err(refuse(format!(
            "node {} is not in the member list",
            identity.node_id
        )));
    }
    if identity.cluster_id == backup.header.cluster_id {
        return Err(refuse(format!(
            "the backup is of cluster '{}'; a restored cluster needs a new cluster id",
            backup.header.cluster_id
        )));
    }
    match std::fs::read_dir(dir).map(|mut e| e.next().is_some()) {
        Ok(true) => {
            return Err(refuse(
                "it is not empty; restore seeds a new data dir only".into(),
            ))
        }
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(refuse(format!("cannot read it: {e}"))),
    }
    // As openraft's `initialize` stamps the first membership entry: term 0,
    // node 0. Each restored member computes the same log id.
    let log_id = LogId::new(
        LeaderId {
            term: 0,
            node_id: 0,
        },
        backup.header.index,
    );
    let voters = members.keys().copied().collect();
    let nodes: BTreeMap<NodeId, BasicNode> = members
        .iter()
        .map(|(id, addr)| (*id, BasicNode::new(addr.clone())))
        .collect();
    let membership = Membership::new(vec![voters], nodes)
        .map_err(|e| refuse(format!("the member list is not a valid membership: {e}")))?;
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
    };
    let meta = encode(&meta).map_err(|e| refuse(format!("cannot encode the metadata: {e}")))?;
    let backend: Arc<dyn Backend> = Arc::new(DiskBackend::open(
        dir,
        crate::DEFAULT_CACHE_BYTES,
        identity,
    )?);
    backend
        .record_level(backup.header.format)
        .map_err(|e| refuse(format!("cannot record the journal format: {e}")))?;
    backend
        .snapshot_put(&meta, &backup.data)
        .map_err(|e| refuse(format!("cannot write the snapshot: {e}")))?;
    backend.note_committed(backup.header.index);
    backend
        .flush()
        .map_err(|e| refuse(format!("cannot sync the database: {e}")))?;
    Ok(log_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Backup {
        let mut s = State::default();
        s.apply(&journal::Update {
            command: Some(journal::pb::update::Command::from(
                journal::pb::coordination::KvInsert {
                    key: "k".into(),
                    value: "v".into(),
                    allow_overwrite: true,
                },
            )),
            ..Default::default()
        });
        Backup::new(s.encode_snapshot(), 7, "old", 1).unwrap()
    }

    fn file_of(b: &Backup) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b");
        b.write(&p).unwrap();
        std::fs::read(p).unwrap()
    }

    #[test]
    fn a_written_backup_reads_back_whole() {
        let b = sample();
        let back = Backup::parse(file_of(&b)).unwrap();
        assert_eq!(back.header, b.header);
        assert_eq!(back.data, b.data);
    }

    #[test]
    fn every_damage_is_refused_with_its_reason() {
        let raw = file_of(&sample());
        let mut flipped = raw.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(Backup::parse(flipped)
            .unwrap_err()
            .contains("checksum mismatch"));
        let cut = raw[..raw.len() - 1].to_vec();
        assert!(Backup::parse(cut).unwrap_err().contains("truncated"));
        assert!(Backup::parse(b"hello".to_vec())
            .unwrap_err()
            .contains("not a coordstore backup"));
        let mut other = sample();
        other.header.format = 99;
        assert!(Backup::parse(other.encode().unwrap())
            .unwrap_err()
            .contains("journal format 99"));
    }

    /// A backup says the level its state needs; a level this build does
    /// not know is refused, every one it knows is read; a namespace export
    /// says level 3 (only a build with namespaces imports one).
    #[test]
    fn backups_and_exports_carry_their_level_and_a_newer_one_is_refused() {
        let b = sample();
        assert_eq!(b.header.format, journal::LEVEL_BASE);
        let mut newer = b.clone();
        newer.header.format = journal::FEATURE_LEVEL + 1;
        let e = Backup::parse(newer.encode().unwrap()).unwrap_err();
        assert!(
            e.contains(&format!(
                "journal format {} (a newer build than this one)",
                journal::FEATURE_LEVEL + 1
            )),
            "{e}"
        );
        let mut known = b.clone();
        known.header.format = journal::FEATURE_LEVEL;
        assert!(Backup::parse(known.encode().unwrap()).is_ok());
        let data = journal::pb::NamespaceData::default();
        let export = Export::new("a", prost::Message::encode_to_vec(&data), 3, "c", 1);
        assert_eq!(export.header.format, journal::LEVEL_NAMESPACES);
        assert!(Export::parse(export.encode().unwrap()).is_ok());
        let mut newer = export.clone();
        newer.header.format = journal::FEATURE_LEVEL + 1;
        let e = Export::parse(newer.encode().unwrap()).unwrap_err();
        assert!(e.contains("a newer build than this one"), "{e}");
        // A namespace holding a field this build does not know.
        let mut bytes = prost::Message::encode_to_vec(&data);
        bytes.extend([0xf8, 0x07, 0x01]); // field 127, a varint
        let odd = Export::new("a", bytes, 3, "c", 1);
        let e = Export::parse(odd.encode().unwrap()).unwrap_err();
        assert!(e.contains("NamespaceData: field 127"), "{e}");
    }

    fn members() -> BTreeMap<NodeId, String> {
        (1..=3).map(|i| (i, format!("127.0.0.1:{i}"))).collect()
    }

    #[test]
    fn a_restored_dir_opens_at_the_saved_index_with_the_state() {
        let b = sample();
        let dir = tempfile::tempdir().unwrap();
        let id = Identity {
            cluster_id: "new".into(),
            node_id: 2,
        };
        let log_id = restore(dir.path(), &id, &b, &members()).unwrap();
        assert_eq!(log_id.index, 7);
        let (_log, sm) = crate::open(dir.path(), crate::DEFAULT_CACHE_BYTES, &id).unwrap();
        let h = sm.handle();
        assert_eq!(h.last_applied(), Some(log_id));
        assert_eq!(h.digest_hex(), b.header.state_digest);
        let voters: Vec<_> = h.membership().membership().voter_ids().collect();
        assert_eq!(voters, vec![1, 2, 3]);
        // The dir is the new cluster's: the old id is refused.
        let old = Identity {
            cluster_id: "old".into(),
            node_id: 2,
        };
        drop((_log, sm));
        assert!(crate::open(dir.path(), crate::DEFAULT_CACHE_BYTES, &old).is_err());
    }

    #[test]
    fn restore_refuses_a_used_dir_the_same_cluster_id_and_a_stranger() {
        let b = sample();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x"), "").unwrap();
        let id = |c: &str, n| Identity {
            cluster_id: c.into(),
            node_id: n,
        };
        let e = restore(dir.path(), &id("new", 1), &b, &members()).unwrap_err();
        assert!(e.reason.contains("not empty"), "{e}");
        let fresh = dir.path().join("fresh");
        let e = restore(&fresh, &id("old", 1), &b, &members()).unwrap_err();
        assert!(e.reason.contains("new cluster id"), "{e}");
        let e = restore(&fresh, &id("new", 4), &b, &members()).unwrap_err();
        assert!(e.reason.contains("not in the member list"), "{e}");
        assert!(!fresh.exists(), "a refused restore leaves nothing behind");
    }
}
