//! Journal feature levels: the level each update and state needs, the
//! cluster's level (raised, never lowered, and implied by what the state
//! holds), and decoding that names what this build does not know while it
//! reads every field earlier builds wrote (retired fields included).
mod common;
use common::*;
use journal::pb::{self, update::Command, CreateNamespace, NamespaceSpec, SetFeatureLevel};
use journal::{NotKnown, State, Update, FEATURE_LEVEL, LEVEL_BASE, LEVEL_NAMESPACES};
use prost::Message;

fn raise(level: u32) -> Update {
    Update::from(Command::SetFeatureLevel(SetFeatureLevel { level }))
}

fn create(name: &str) -> Update {
    Update::from(Command::CreateNamespace(Box::new(CreateNamespace {
        name: name.into(),
        config: Some(config(1, &Opts::default())),
        spec: Some(NamespaceSpec {
            port: 9100,
            ..Default::default()
        }),
        service_incarnation: 1,
        ..Default::default()
    })))
}

#[test]
fn each_update_needs_the_level_of_what_it_uses() {
    assert_eq!(upd(insert("k", "v", true), 1).required_level(), LEVEL_BASE);
    let in_ns = Update {
        namespace: "job-a".into(),
        ..upd(insert("k", "v", true), 1)
    };
    assert_eq!(in_ns.required_level(), LEVEL_NAMESPACES);
    assert_eq!(create("a").required_level(), LEVEL_NAMESPACES);
    assert_eq!(raise(LEVEL_NAMESPACES).required_level(), LEVEL_NAMESPACES);
    assert_eq!(raise(FEATURE_LEVEL + 2).required_level(), FEATURE_LEVEL + 2);
    assert_eq!(create("a").command_name(), "CreateNamespace");
    assert_eq!(upd(insert("k", "v", true), 1).command_name(), "KvInsert");
    assert!(!journal::client_proposable(
        raise(3).command.as_ref().unwrap()
    ));
}

/// A namespace created or imported needs the level its state would: the
/// PyTorch store's when its spec or its imported state holds any of it
/// (an import whose exported spec carries `torch_plaintext` needed only
/// namespaces' before, though the state it made needed the store's).
#[test]
fn a_namespace_needs_the_level_of_the_state_it_makes() {
    let plaintext = Some(NamespaceSpec {
        torch_plaintext: true,
        ..Default::default()
    });
    let with = |spec: Option<NamespaceSpec>, data: Option<pb::NamespaceData>| {
        let mut u = create("a");
        if let Some(Command::CreateNamespace(c)) = &mut u.command {
            if spec.is_some() {
                c.spec = spec;
            }
            c.data = data;
        }
        u.required_level()
    };
    assert_eq!(with(None, None), LEVEL_NAMESPACES);
    assert_eq!(with(plaintext.clone(), None), journal::LEVEL_TORCH);
    let imported = pb::NamespaceData {
        spec: plaintext,
        ..Default::default()
    };
    assert_eq!(with(None, Some(imported)), journal::LEVEL_TORCH);
    let store = pb::NamespaceData {
        torch: Some(Default::default()),
        ..Default::default()
    };
    assert_eq!(with(None, Some(store)), journal::LEVEL_TORCH);
}

#[test]
fn the_cluster_level_rises_never_falls_and_follows_what_the_state_holds() {
    let mut s = cluster(1, Opts::default());
    assert_eq!(
        (s.feature_level(), s.raised_level()),
        (LEVEL_BASE, LEVEL_BASE)
    );
    // A state with namespaces was written by members that apply them.
    ok(&apply(&mut s, create("a").command.unwrap(), 2));
    assert_eq!(
        (s.feature_level(), s.raised_level()),
        (LEVEL_NAMESPACES, LEVEL_BASE)
    );
    ok(&s.apply(&raise(LEVEL_NAMESPACES)));
    assert_eq!(s.raised_level(), LEVEL_NAMESPACES);
    ok(&s.apply(&raise(LEVEL_BASE)));
    assert_eq!(s.raised_level(), LEVEL_NAMESPACES, "it never falls");
    let back = State::decode_snapshot(&s.encode_snapshot()).unwrap();
    assert_eq!(back.raised_level(), LEVEL_NAMESPACES);
    assert_eq!(back.digest(), s.digest());
    // A state that never raised its level encodes as before (no field 10).
    let plain = cluster(1, Opts::default());
    let d = pb::StateData::decode(plain.encode_snapshot().as_slice()).unwrap();
    assert_eq!(d.feature_level, 0);
}

#[test]
fn decoding_names_what_this_build_does_not_know() {
    let u = upd(insert("k", "v", true), 1);
    let mut bytes = u.encode_to_vec();
    // A command of a newer build: field 16 of Update, a message.
    bytes.extend([0x82, 0x01, 0x02, 0x08, 0x01]);
    let e = journal::decode_known::<Update>(&bytes).unwrap_err();
    assert_eq!(e, NotKnown::Unknown(vec!["Update: field 16".into()]));
    assert!(e.to_string().contains("does not know"), "{e}");
    // prost alone: the command vanished without a word.
    assert_eq!(Update::decode(bytes.as_slice()).unwrap(), u);
    // Garbage is not an unknown field, and says so.
    let bad = journal::decode_known::<Update>(&[0x0a, 0x05, 0x01]).unwrap_err();
    assert!(matches!(bad, NotKnown::Malformed(_)), "{bad:?}");
    // What this build knows decodes as it always did.
    assert_eq!(
        journal::decode_known::<Update>(&u.encode_to_vec()).unwrap(),
        u
    );
}

/// A field earlier builds wrote and this one retired (`reserved`) is read
/// past, as before: a snapshot of such a build still loads.
#[test]
fn a_retired_field_of_an_earlier_build_is_read_past() {
    let mut s = cluster(1, Opts::default());
    ok(&s.apply(&upd(insert("k", "v", true), 2)));
    let mut data = pb::StateData::decode(s.encode_snapshot().as_slice()).unwrap();
    let mut coordination = data.coordination.take().unwrap().encode_to_vec();
    // coordination.Data field 12 (kv_bytes in a build that kept the count
    // in the state; reserved since).
    coordination.extend([0x60, 0x09]);
    let mut bytes = data.encode_to_vec();
    bytes.push(0xa2); // StateData field 20, length-delimited
    bytes.push(0x01);
    prost::encoding::encode_varint(coordination.len() as u64, &mut bytes);
    bytes.extend(&coordination);
    let back = State::decode_snapshot(&bytes).expect("a retired field is read past");
    assert_eq!(back.digest(), s.digest());
    // The same bytes with field 13 instead, which no build has written: refused.
    let n = bytes.len() - 2;
    bytes[n] = 0x68;
    let e = State::decode_snapshot(&bytes).unwrap_err().to_string();
    assert!(e.contains("StateData.coordination: field 13"), "{e}");
}
