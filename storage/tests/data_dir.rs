//! A data dir that is foreign, corrupted or not ours is refused with an error
//! naming the path and the reason; a good one reopens with its state.

use std::io::Cursor;
use std::path::Path;

use journal::pb::{coordination::KvInsert, update::Command, UpdateBatch};
use journal::Update;
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder};
use storage::{Entry, Identity, LeaderId, LogId, Proposal};
use tempfile::TempDir;

fn id(cluster: &str, node: u64) -> Identity {
    Identity {
        cluster_id: cluster.into(),
        node_id: node,
    }
}

/// Committed entries as the state machine gets them (no waiters).
fn stream(
    entries: Vec<Entry>,
) -> impl futures_util::Stream<
    Item = std::io::Result<openraft::storage::EntryResponder<storage::TypeConfig>>,
> + Unpin {
    futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))))
}

/// `sled::open` of a dir whose database was just dropped: sled releases its
/// file (and its lock) from a job on its thread pool moments after the
/// last handle goes.
fn sled_reopen(dir: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::open(dir) {
            Ok(db) => return db,
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("reopening {}: {e}", dir.display()),
        }
    }
}

fn open_err(dir: &Path, identity: &Identity) -> String {
    match storage::open(dir, 8 << 20, identity) {
        Ok(_) => panic!("{} was accepted", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn kv_entry(index: u64, key: &str) -> Entry {
    let u = Update {
        command: Some(Command::from(KvInsert {
            key: key.into(),
            value: "v".into(),
            allow_overwrite: true,
        })),
        ..Default::default()
    };
    Entry {
        log_id: LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(Proposal::new(UpdateBatch { updates: vec![u] })),
    }
}

#[test]
fn another_nodes_dir_is_refused() {
    let dir = TempDir::new().unwrap();
    drop(storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap());
    let err = open_err(dir.path(), &id("c1", 2));
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(err.contains("belongs to node 1 of cluster 'c1'"), "{err}");
}

/// The journal format a dir records, as sled holds it.
fn set_format(dir: &std::path::Path, format: Option<u32>) {
    let db = sled_reopen(dir);
    let meta = db.open_tree("meta").unwrap();
    match format {
        Some(f) => {
            meta.insert("journal_format", f.to_string().as_bytes())
                .unwrap();
        }
        None => assert!(meta.remove("journal_format").unwrap().is_some()),
    }
    db.flush().unwrap();
}

fn format_of(dir: &std::path::Path) -> u32 {
    let db = sled_reopen(dir);
    let meta = db.open_tree("meta").unwrap();
    let raw = meta.get("journal_format").unwrap().unwrap();
    std::str::from_utf8(&raw).unwrap().parse().unwrap()
}

#[test]
fn a_dir_of_another_journal_format_is_refused() {
    let dir = TempDir::new().unwrap();
    drop(storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap());
    // A new dir needs the base level until something needs more.
    assert_eq!(format_of(dir.path()), journal::LEVEL_BASE);
    // A dir written before the format was recorded (format 1).
    set_format(dir.path(), None);
    let err = open_err(dir.path(), &id("c1", 1));
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(
        err.contains(&format!(
            "journal format 1, and this coordstore reads formats {} to {}",
            journal::OLDEST_FORMAT,
            journal::FEATURE_LEVEL
        )),
        "{err}"
    );
    // A dir a newer build wrote: a downgrade, refused.
    set_format(dir.path(), Some(journal::FEATURE_LEVEL + 1));
    let err = open_err(dir.path(), &id("c1", 1));
    assert!(
        err.contains(&format!(
            "journal format {} (a newer build than this one)",
            journal::FEATURE_LEVEL + 1
        )) && err.contains("a downgrade"),
        "{err}"
    );
    // Every format this build reads reopens, and keeps its format.
    for format in journal::OLDEST_FORMAT..=journal::FEATURE_LEVEL {
        set_format(dir.path(), Some(format));
        drop(storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap());
        assert_eq!(format_of(dir.path()), format);
    }
}

#[test]
fn another_clusters_dir_is_refused() {
    let dir = TempDir::new().unwrap();
    drop(storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap());
    let err = open_err(dir.path(), &id("c2", 1));
    assert!(
        err.contains("of cluster 'c1', not node 1 of cluster 'c2'"),
        "{err}"
    );
}

#[test]
fn a_dir_with_other_files_is_refused() {
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    let err = open_err(dir.path(), &id("c1", 1));
    assert!(err.contains("no coordstore (sled) database"), "{err}");
    // Nothing was created over the foreign data.
    assert!(!dir.path().join("db").exists());
}

#[test]
fn a_truncated_database_is_refused() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            // Enough entries that the database file spans several segments.
            for i in 1..=200u64 {
                let big = "k".repeat(2000) + &i.to_string();
                let e = kv_entry(i, &big);
                log.write_entries([e]).await.unwrap();
            }
            let committed = LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                200,
            );
            log.save_committed(Some(committed)).await.unwrap();
            // The marker is written by the flusher, after the log is durable.
            log.wait_flushed().await.unwrap();
        });
    }
    let db = dir.path().join("db");
    let len = std::fs::metadata(&db).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    f.set_len(len / 3).unwrap();
    drop(f);
    let err = open_err(dir.path(), &id("c1", 1));
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(
        err.contains("corrupted")
            || err.contains("lost data")
            || err.contains("without an identity"),
        "{err}"
    );
}

/// The log's own files cut short (a disk that lost flushed data): the
/// committed marker tells, and the dir is refused.
#[test]
fn a_truncated_log_file_is_refused() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let entries: Vec<Entry> = (1..=50).map(|i| kv_entry(i, &format!("k{i}"))).collect();
            log.write_entries(entries).await.unwrap();
            let committed = LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                50,
            );
            log.save_committed(Some(committed)).await.unwrap();
            log.wait_flushed().await.unwrap();
        });
    }
    let segment = std::fs::read_dir(dir.path().join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .expect("a log segment");
    // The records' end: the file goes on in zeros allocated ahead.
    let data = std::fs::read(&segment).unwrap();
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    f.set_len(end as u64 / 3).unwrap();
    drop(f);
    let err = open_err(dir.path(), &id("c1", 1));
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(err.contains("lost data"), "{err}");
}

/// The committed id is saved without a sync, in another file than the log:
/// after a crash it can be ahead of the log's durable end. It is read back
/// as no more than the log holds.
#[tokio::test]
async fn a_committed_id_ahead_of_the_log_reads_back_as_the_logs_end() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
        let entries: Vec<Entry> = (1..=5).map(|i| kv_entry(i, &format!("k{i}"))).collect();
        log.write_entries(entries).await.unwrap();
        let ahead = LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            9,
        );
        log.save_committed(Some(ahead)).await.unwrap();
        assert_eq!(log.read_committed().await.unwrap().unwrap().index, 5);
        log.wait_flushed().await.unwrap();
    }
    // The committed marker is written after the log's flush: in a crash
    // that kept the id but not the log records, it never got written.
    std::fs::remove_file(dir.path().join("COMMITTED")).unwrap();
    let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    assert_eq!(log.read_committed().await.unwrap().unwrap().index, 5);
}

/// A data dir from before the log had its own files keeps its log in
/// sled's tree `log`: it opens with every entry, moved to the files.
#[tokio::test]
async fn a_log_kept_in_sled_moves_to_its_own_files() {
    let dir = TempDir::new().unwrap();
    let entries: Vec<Entry> = (1..=30).map(|i| kv_entry(i, &format!("k{i}"))).collect();
    {
        let (log, _sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
        drop(log);
    }
    // As the earlier layout wrote it: big-endian index keys, bincode values.
    std::fs::remove_dir_all(dir.path().join("wal")).unwrap();
    {
        let db = sled_reopen(dir.path());
        let tree = db.open_tree("log").unwrap();
        for e in &entries {
            let bytes = bincode::serialize(e).unwrap();
            tree.insert(e.log_id.index.to_be_bytes(), bytes).unwrap();
        }
        db.flush().unwrap();
    }
    {
        let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
        let back = log.try_get_log_entries(1..=30).await.unwrap();
        assert_eq!(back.len(), 30);
        assert_eq!(back[29].log_id, entries[29].log_id);
        assert_eq!(log.last_index().unwrap(), 30);
    }
    let db = sled_reopen(dir.path());
    assert!(
        db.open_tree("log").unwrap().is_empty(),
        "sled's copy is gone"
    );
    drop(db);
    // And it reopens from the files alone.
    let (mut log, _sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    assert_eq!(log.try_get_log_entries(1..=30).await.unwrap().len(), 30);
}

#[test]
fn a_corrupted_legacy_snapshot_record_is_refused() {
    let dir = TempDir::new().unwrap();
    {
        let (log, _sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
        drop(log);
    }
    {
        // Overwrite the snapshot record with garbage through sled itself.
        let db = sled_reopen(dir.path());
        db.open_tree("meta")
            .unwrap()
            .insert("snapshot", &b"\xff\xff garbage"[..])
            .unwrap();
        db.flush().unwrap();
    }
    let err = open_err(dir.path(), &id("c1", 1));
    assert!(err.contains("snapshot record is corrupted"), "{err}");
}

/// Builds a snapshot of 10 applied entries in `dir`.
async fn snapshot_of_ten(dir: &Path) {
    let (log, mut sm) = storage::open(dir, 8 << 20, &id("c1", 1)).unwrap();
    let entries: Vec<Entry> = (1..=10).map(|i| kv_entry(i, &format!("k{i}"))).collect();
    log.write_entries(entries.clone()).await.unwrap();
    sm.apply(stream(entries)).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_corrupted_or_truncated_snapshot_file_is_refused() {
    for (damage, why) in [
        (0usize, "fails its checksum"),
        (1, "fails its checksum"),
        (2, "truncated"),
    ] {
        let dir = TempDir::new().unwrap();
        snapshot_of_ten(dir.path()).await;
        let path = dir.path().join("snapshot");
        let mut raw = std::fs::read(&path).unwrap();
        match damage {
            0 => raw[20] ^= 0x40,
            1 => {
                let n = raw.len();
                raw[n - 10] ^= 1;
            }
            _ => raw.truncate(3),
        }
        std::fs::write(&path, raw).unwrap();
        let err = open_err(dir.path(), &id("c1", 1));
        assert!(err.contains("snapshot") && err.contains(why), "{err}");
    }
}

#[tokio::test]
async fn a_legacy_snapshot_record_loads_and_gives_way_to_the_next_snapshot() {
    let dir = TempDir::new().unwrap();
    snapshot_of_ten(dir.path()).await;
    // Move the snapshot into sled's meta tree, where older versions kept it.
    let (meta, data) = {
        let raw = std::fs::read(dir.path().join("snapshot")).unwrap();
        let meta_len = u64::from_le_bytes(raw[8..16].try_into().unwrap()) as usize;
        let meta: storage::SnapshotMeta = bincode::deserialize(&raw[16..16 + meta_len]).unwrap();
        let at = 16 + meta_len;
        let data_len = u64::from_le_bytes(raw[at..at + 8].try_into().unwrap()) as usize;
        (meta, raw[at + 8..at + 8 + data_len].to_vec())
    };
    std::fs::remove_file(dir.path().join("snapshot")).unwrap();
    {
        let db = sled_reopen(dir.path());
        let record = bincode::serialize(&(&meta, &data)).unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert("snapshot", record)
            .unwrap();
        db.flush().unwrap();
    }
    let (_log, mut sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.unwrap().index, 10);
    assert!(sm
        .handle()
        .read(|s| s.coordination().kv_get("k10").is_some()));
    // The next snapshot goes to its own file and the record is dropped.
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    drop((_log, sm));
    assert!(dir.path().join("snapshot").is_file());
    let db = sled_reopen(dir.path());
    assert!(db
        .open_tree("meta")
        .unwrap()
        .get("snapshot")
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn state_is_rebuilt_from_snapshot_plus_log() {
    let dir = TempDir::new().unwrap();
    let digest;
    {
        let (log, mut sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
        let entries: Vec<Entry> = (1..=20).map(|i| kv_entry(i, &format!("k{i}"))).collect();
        for e in &entries {
            log.write_entries([e.clone()]).await.unwrap();
        }
        sm.apply(stream(entries[..10].to_vec())).await.unwrap();
        let mut b = sm.get_snapshot_builder().await;
        b.build_snapshot().await.unwrap();
        sm.apply(stream(entries[10..].to_vec())).await.unwrap();
        digest = sm.handle().digest_hex();
    }
    let (mut log, mut sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    // The snapshot brings the first 10; replaying the log after it the rest.
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.unwrap().index, 10);
    let rest = log.try_get_log_entries(11..=20).await.unwrap();
    assert_eq!(rest.len(), 10);
    sm.apply(stream(rest)).await.unwrap();
    assert_eq!(sm.handle().digest_hex(), digest);
    assert!(sm
        .handle()
        .read(|s| s.coordination().kv_get("k20").is_some()));
    let snap = sm.get_current_snapshot().await.unwrap().unwrap();
    let restored =
        journal::State::decode_snapshot(&Cursor::new(snap.snapshot.into_inner()).into_inner())
            .unwrap();
    assert!(
        restored.coordination().kv_get("k10").is_some()
            && restored.coordination().kv_get("k11").is_none()
    );
}

/// Installs a snapshot from a leader (term 2, node 2) at `index`: a state
/// holding the one key "from-leader".
async fn install_from_leader(sm: &mut storage::StateMachine, index: u64) {
    let mut leader_state = journal::State::new();
    leader_state.apply(&Update::from(KvInsert {
        key: "from-leader".into(),
        value: "x".into(),
        allow_overwrite: false,
    }));
    let meta = storage::SnapshotMeta {
        last_log_id: Some(LogId::new(
            LeaderId {
                term: 2,
                node_id: 2,
            },
            index,
        )),
        last_membership: Default::default(),
    };
    sm.install_snapshot(&meta, Cursor::new(leader_state.encode_snapshot()))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_late_snapshot_build_never_replaces_a_newer_installed_snapshot() {
    let dir = TempDir::new().unwrap();
    let (_log, mut sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    let entries: Vec<Entry> = (1..=5).map(|i| kv_entry(i, &format!("k{i}"))).collect();
    sm.apply(stream(entries)).await.unwrap();
    // A build starts at index 5 ...
    let mut late = sm.get_snapshot_builder().await;
    // ... while a snapshot at index 500 arrives from the leader.
    install_from_leader(&mut sm, 500).await;
    late.build_snapshot().await.unwrap();
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id.unwrap().index, 500);
    drop((sm, late, _log));
    // And a restart comes back from the installed one.
    let (_log, mut sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.unwrap().index, 500);
    assert!(sm
        .handle()
        .read(|s| s.coordination().kv_get("from-leader").is_some()));
}

#[test]
fn a_dir_in_use_by_another_node_is_refused_as_such() {
    let dir = TempDir::new().unwrap();
    let _first = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    let err = open_err(dir.path(), &id("c1", 1));
    assert!(err.contains("in use by another process"), "{err}");
}

/// A staged snapshot whose data does not come to the announced length is
/// refused and never put in place: the stored one stays.
#[tokio::test]
async fn a_staged_snapshot_of_the_wrong_length_is_refused() {
    use storage::Backend;
    let dir = TempDir::new().unwrap();
    snapshot_of_ten(dir.path()).await;
    let before = std::fs::read(dir.path().join("snapshot")).unwrap();
    let backend = storage::DiskBackend::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    for written in [9usize, 11] {
        let err = backend
            .snapshot_stage("build", b"meta", 10, &mut |w| {
                w.write_all(&vec![1; written])
            })
            .unwrap_err();
        assert!(err.to_string().contains("10 were announced"), "{err}");
    }
    assert_eq!(std::fs::read(dir.path().join("snapshot")).unwrap(), before);
    // Staged with the right length, it replaces the stored one whole.
    backend
        .snapshot_stage("build", b"meta", 3, &mut |w| w.write_all(b"abc"))
        .unwrap();
    assert_eq!(std::fs::read(dir.path().join("snapshot")).unwrap(), before);
    backend.snapshot_commit("build").unwrap();
    assert_eq!(
        backend.snapshot_get().unwrap(),
        Some((b"meta".to_vec(), b"abc".to_vec()))
    );
}

/// Records what the state machine tells its observer: each change's KV
/// revision with the applied index published at that moment, and the stop.
#[derive(Default)]
struct Recorder {
    applied: std::sync::OnceLock<tokio::sync::watch::Receiver<u64>>,
    seen: std::sync::Mutex<Vec<(u64, u64)>>,
    touched: std::sync::Mutex<Vec<journal::Touched>>,
    stopped: std::sync::atomic::AtomicBool,
}

impl storage::ApplyObserver for Recorder {
    fn changed(&self, state: &journal::State, touched: &journal::Touched) {
        self.touched.lock().unwrap().push(touched.clone());
        let published = self.applied.get().map_or(0, |rx| *rx.borrow());
        let revision = state.coordination().kv_revision();
        self.seen.lock().unwrap().push((revision, published));
    }

    fn stopped(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test]
async fn an_observer_sees_each_change_before_it_is_published_and_the_stop() {
    let dir = TempDir::new().unwrap();
    let (_log, mut sm) = storage::open(dir.path(), 8 << 20, &id("c1", 1)).unwrap();
    let entries: Vec<Entry> = (1..=2).map(|i| kv_entry(i, &format!("k{i}"))).collect();
    sm.apply(stream(entries)).await.unwrap();
    let recorder = std::sync::Arc::new(Recorder::default());
    let handle = sm.handle();
    recorder.applied.set(handle.subscribe()).unwrap();
    assert!(handle.observe(recorder.clone()));
    // Only one observer.
    assert!(!handle.observe(std::sync::Arc::new(Recorder::default())));
    let entries: Vec<Entry> = (3..=5).map(|i| kv_entry(i, &format!("k{i}"))).collect();
    sm.apply(stream(entries)).await.unwrap();
    install_from_leader(&mut sm, 500).await;
    // At the observer's start, after the three applies (one call, one
    // change, told before index 5 was published), after the install.
    assert_eq!(*recorder.seen.lock().unwrap(), vec![(2, 2), (5, 2), (1, 5)]);
    // What changed: everything at the start, the three keys the applies
    // wrote, everything at the install.
    let keys = ["k3", "k4", "k5"].map(|k| (String::new(), journal::Object::Key(k.into())));
    assert_eq!(
        *recorder.touched.lock().unwrap(),
        vec![
            journal::Touched::everything(),
            journal::Touched {
                objects: keys.to_vec(),
                ..Default::default()
            },
            journal::Touched::everything(),
        ]
    );
    assert!(!recorder.stopped.load(std::sync::atomic::Ordering::SeqCst));
    drop(sm);
    assert!(recorder.stopped.load(std::sync::atomic::Ordering::SeqCst));
}
