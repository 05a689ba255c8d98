//! Decoding that knows what it skipped. prost drops a field it does not
//! know (a field a newer build added to a command), and an unknown variant
//! of a `oneof` (a command a newer build added) decodes as no command at
//! all, which the state applies as nothing: a node of an older build would
//! apply part of an entry, or none of it, and say nothing while its state
//! parts from the others'. An entry or a snapshot decoded here instead names
//! every field this build does not know, so the node stops.
//!
//! [`decode_known`] decodes as prost does, then compares the length of the
//! message's encoding with its input: prost encodes canonically, so they
//! differ only when something was dropped (or the input was not canonical).
//! Only then it walks the input against the schema this build was compiled
//! with (the journal's protobuf descriptors, built in): a field whose
//! number its message neither declares nor reserves is unknown. Reserved
//! numbers are fields earlier builds wrote and this one retired on
//! purpose; they are skipped as before.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost::bytes::Buf;
use prost::Message;

/// The journal's descriptors (`FileDescriptorSet`), written by the build.
static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/journal_descriptors.bin"));

/// Why bytes could not be decoded in full.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotKnown {
    /// Not a valid encoding of the message at all.
    Malformed(String),
    /// A valid encoding holding fields this build does not know: each as
    /// `Message.field: field N` (the path from the top message).
    Unknown(Vec<String>),
}

impl std::fmt::Display for NotKnown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotKnown::Malformed(e) => write!(f, "it does not decode: {e}"),
            NotKnown::Unknown(fields) => write!(
                f,
                "it holds {} this build (journal feature level {}) does not know: {} \
                 (written by a newer build: run that build, or a newer one, on this node)",
                if fields.len() == 1 {
                    "a field"
                } else {
                    "fields"
                },
                crate::FEATURE_LEVEL,
                fields.join(", ")
            ),
        }
    }
}

impl std::error::Error for NotKnown {}

/// Decodes `bytes` as `M`, refusing an encoding with a field this build
/// does not know (see the module).
pub fn decode_known<M: Message + prost::Name + Default>(bytes: &[u8]) -> Result<M, NotKnown> {
    let m = M::decode(bytes).map_err(|e| NotKnown::Malformed(e.to_string()))?;
    check_known::<M>(&m, bytes)?;
    Ok(m)
}

/// Checks that `m`, decoded from `bytes`, kept every field of it (see the
/// module).
pub fn check_known<M: Message + prost::Name>(m: &M, bytes: &[u8]) -> Result<(), NotKnown> {
    if m.encoded_len() == bytes.len() {
        return Ok(());
    }
    let unknown = unknown_fields(&format!(".{}", M::full_name()), bytes);
    if unknown.is_empty() {
        return Ok(());
    }
    Err(NotKnown::Unknown(unknown))
}

/// The fields of `bytes`, an encoding of message `type_name` (`.pkg.Name`),
/// that this build's schema neither declares nor reserves, as paths.
pub fn unknown_fields(type_name: &str, bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema(), type_name, bytes, &short(type_name), &mut out);
    out
}

/// A message as the walk needs it: its fields by number (name, and the
/// message type of a message field), and its reserved numbers.
#[derive(Default)]
struct MessageInfo {
    fields: HashMap<u32, (String, Option<String>)>,
    reserved: Vec<std::ops::Range<i32>>,
}

type Schema = HashMap<String, MessageInfo>;

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let set = prost_types::FileDescriptorSet::decode(DESCRIPTORS)
            .expect("the journal's descriptors, built in, decode");
        let mut schema = Schema::new();
        for file in &set.file {
            let package = file.package.as_deref().unwrap_or_default();
            for m in &file.message_type {
                add_message(&mut schema, &format!(".{package}"), m);
            }
        }
        schema
    })
}

fn add_message(schema: &mut Schema, scope: &str, m: &prost_types::DescriptorProto) {
    use prost_types::field_descriptor_proto::Type;
    let name = format!("{scope}.{}", m.name());
    let mut info = MessageInfo::default();
    for f in &m.field {
        let message = (f.r#type() == Type::Message).then(|| f.type_name().to_string());
        info.fields
            .insert(f.number() as u32, (f.name().to_string(), message));
    }
    info.reserved = m
        .reserved_range
        .iter()
        .map(|r| r.start()..r.end())
        .collect();
    for nested in &m.nested_type {
        add_message(schema, &name, nested);
    }
    schema.insert(name, info);
}

/// The last part of a type name (`.a.b.Update` → `Update`).
fn short(type_name: &str) -> String {
    type_name
        .rsplit('.')
        .next()
        .unwrap_or(type_name)
        .to_string()
}

/// Records in `out` every field of `bytes` (message `type_name`, reached as
/// `path`) the schema does not know, descending into message fields.
fn walk(schema: &Schema, type_name: &str, mut bytes: &[u8], path: &str, out: &mut Vec<String>) {
    let Some(info) = schema.get(type_name) else {
        out.push(format!("{path}: a message of unknown type {type_name}"));
        return;
    };
    while bytes.has_remaining() {
        let Ok(key) = prost::encoding::decode_varint(&mut bytes) else {
            return;
        };
        let (number, wire_type) = ((key >> 3) as u32, key & 7);
        let Some(value) = take_value(&mut bytes, wire_type) else {
            out.push(format!("{path}: a field {number} it cannot read"));
            return;
        };
        match info.fields.get(&number) {
            Some((name, Some(child))) if wire_type == 2 => {
                walk(schema, child, value, &format!("{path}.{name}"), out)
            }
            Some(_) => {}
            None if info.reserved.iter().any(|r| r.contains(&(number as i32))) => {}
            None => out.push(format!("{path}: field {number}")),
        }
    }
}

/// Takes the value of a field of wire type `wire_type` off `bytes`: its
/// bytes (a length-delimited field's content), or `None` if it is cut off
/// or of a wire type proto3 does not write.
fn take_value<'a>(bytes: &mut &'a [u8], wire_type: u64) -> Option<&'a [u8]> {
    let len = match wire_type {
        0 => {
            let start = *bytes;
            prost::encoding::decode_varint(bytes).ok()?;
            return Some(&start[..start.len() - bytes.len()]);
        }
        1 => 8,
        2 => usize::try_from(prost::encoding::decode_varint(bytes).ok()?).ok()?,
        5 => 4,
        _ => return None,
    };
    if bytes.len() < len {
        return None;
    }
    let (value, rest) = bytes.split_at(len);
    *bytes = rest;
    Some(value)
}
