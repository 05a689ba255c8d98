//! torch 2.15's TCPStore wire format (`docs/pytorch.md`, Wire format): one
//! op byte, then the op's fields; integers little-endian; a string is a
//! u64 length and its bytes. No request id, no length header: a request is
//! known complete only by parsing it. Limits are checked on a length or
//! count as soon as it arrives, before its body, as torch's server does.
//! The node's server, the relay and the benchmark's clients share it.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Longest key torch's server accepts (bytes on the wire).
pub const MAX_KEY_BYTES: usize = 8 << 10;
/// Longest value (or other payload field) torch's server accepts.
pub const MAX_VALUE_BYTES: usize = 8 << 20;
/// Most keys in one CHECK, WAIT, MULTI_GET or MULTI_SET.
pub const MAX_KEY_COUNT: u64 = 128 << 10;

/// The number a VALIDATE carries.
pub const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;
/// WAIT's and BARRIER's answer.
pub const STOP_WAITING: u8 = 0;
/// CANCEL_WAIT's answer.
pub const WAIT_CANCELED: u8 = 1;
/// CHECK's answers.
pub const READY: u8 = 0;
/// CHECK's answer when a key is missing.
pub const NOT_READY: u8 = 1;

/// One request.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// 0: the handshake's first message.
    Validate(u32),
    /// 1.
    Set { key: String, value: Bytes },
    /// 2.
    CompareSet {
        key: String,
        expected: Bytes,
        desired: Bytes,
    },
    /// 3.
    Get { key: String },
    /// 4.
    Add { key: String, delta: i64 },
    /// 5.
    Check { keys: Vec<String> },
    /// 6.
    Wait { keys: Vec<String> },
    /// 7.
    NumKeys,
    /// 8.
    DeleteKey { key: String },
    /// 9.
    Append { key: String, value: Bytes },
    /// 10.
    MultiGet { keys: Vec<String> },
    /// 11: the pairs of a MULTI_SET that have arrived whole (a MULTI_SET
    /// comes as one or more of these, each applied as it comes, as torch's
    /// server applies pair by pair).
    MultiSet { pairs: Vec<(String, Bytes)> },
    /// 12.
    CancelWait,
    /// 13.
    Ping(u32),
    /// 14.
    QueuePush { key: String, value: Bytes },
    /// 15.
    QueuePop { key: String },
    /// 16.
    QueueLen { key: String },
    /// 17.
    ListKeys,
    /// 18.
    Barrier { key: String, world_size: i64 },
}

impl Op {
    /// The op's name (metrics, logs).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Validate(_) => "validate",
            Op::Set { .. } => "set",
            Op::CompareSet { .. } => "compare_set",
            Op::Get { .. } => "get",
            Op::Add { .. } => "add",
            Op::Check { .. } => "check",
            Op::Wait { .. } => "wait",
            Op::NumKeys => "num_keys",
            Op::DeleteKey { .. } => "delete_key",
            Op::Append { .. } => "append",
            Op::MultiGet { .. } => "multi_get",
            Op::MultiSet { .. } => "multi_set",
            Op::CancelWait => "cancel_wait",
            Op::Ping(_) => "ping",
            Op::QueuePush { .. } => "queue_push",
            Op::QueuePop { .. } => "queue_pop",
            Op::QueueLen { .. } => "queue_len",
            Op::ListKeys => "list_keys",
            Op::Barrier { .. } => "barrier",
        }
    }
}

/// Input that ends the connection (torch's server closes it, answering
/// nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bad {
    /// An op byte torch 2.15 does not know.
    UnknownOp(u8),
    /// A key longer than [`MAX_KEY_BYTES`].
    KeyTooLong(u64),
    /// A value or other payload longer than [`MAX_VALUE_BYTES`].
    ValueTooLong(u64),
    /// More keys than [`MAX_KEY_COUNT`] in one request.
    TooManyKeys(u64),
    /// A key that is not UTF-8 (stock clients send text keys; the store
    /// keeps them as text).
    KeyNotText,
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::UnknownOp(op) => write!(f, "unknown op {op}"),
            Bad::KeyTooLong(n) => write!(f, "a key of {n} bytes (at most {MAX_KEY_BYTES})"),
            Bad::ValueTooLong(n) => write!(f, "a value of {n} bytes (at most {MAX_VALUE_BYTES})"),
            Bad::TooManyKeys(n) => write!(f, "{n} keys in one request (at most {MAX_KEY_COUNT})"),
            Bad::KeyNotText => write!(f, "a key that is not UTF-8"),
        }
    }
}

/// Where a parse stopped: more bytes are needed, or the input is bad.
enum Stop {
    More,
    Bad(Bad),
}

impl From<Bad> for Stop {
    fn from(b: Bad) -> Self {
        Stop::Bad(b)
    }
}

/// A parse over the bytes received so far: consumes nothing until a
/// request is whole (see [`Decoder::decode`]).
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end = self.at.checked_add(n).ok_or(Stop::More)?;
        let b = self.buf.get(self.at..end).ok_or(Stop::More)?;
        self.at = end;
        Ok(b)
    }

    fn u8(&mut self) -> Result<u8, Stop> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn i64(&mut self) -> Result<i64, Stop> {
        Ok(self.u64()? as i64)
    }

    fn key(&mut self) -> Result<String, Stop> {
        let n = self.u64()?;
        if n > MAX_KEY_BYTES as u64 {
            return Err(Bad::KeyTooLong(n).into());
        }
        let b = self.take(n as usize)?;
        String::from_utf8(b.to_vec()).map_err(|_| Bad::KeyNotText.into())
    }

    fn payload(&mut self) -> Result<Bytes, Stop> {
        let n = self.u64()?;
        if n > MAX_VALUE_BYTES as u64 {
            return Err(Bad::ValueTooLong(n).into());
        }
        Ok(Bytes::copy_from_slice(self.take(n as usize)?))
    }

    fn count(&mut self) -> Result<u64, Stop> {
        let n = self.u64()?;
        if n > MAX_KEY_COUNT {
            return Err(Bad::TooManyKeys(n).into());
        }
        Ok(n)
    }

    fn keys(&mut self) -> Result<Vec<String>, Stop> {
        let n = self.count()?;
        // Not `with_capacity(n)`: the count may come long before its keys.
        let mut keys = Vec::new();
        for _ in 0..n {
            keys.push(self.key()?);
        }
        Ok(keys)
    }
}

/// Splits a connection's byte stream into requests.
#[derive(Debug, Default)]
pub struct Decoder {
    /// Pairs of a MULTI_SET still to come.
    multi_set_left: u64,
}

impl Decoder {
    /// The next whole request at the front of `buf` (consumed), `Ok(None)`
    /// until more bytes arrive, or the input that ends the connection. A
    /// VALIDATE is read like any op: the handshake is the connection's.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Op>, Bad> {
        if self.multi_set_left > 0 {
            return self.multi_set_pairs(buf);
        }
        let mut c = Cursor {
            buf: &buf[..],
            at: 0,
        };
        let parsed = parse(&mut c);
        let used = c.at;
        match parsed {
            Ok(Parsed::Op(op)) => {
                buf.advance(used);
                Ok(Some(op))
            }
            Ok(Parsed::MultiSet(n)) => {
                buf.advance(used);
                self.multi_set_left = n;
                if n == 0 {
                    return Ok(Some(Op::MultiSet { pairs: Vec::new() }));
                }
                self.multi_set_pairs(buf)
            }
            Err(Stop::More) => Ok(None),
            Err(Stop::Bad(b)) => Err(b),
        }
    }

    /// The MULTI_SET pairs that have arrived whole, if any.
    fn multi_set_pairs(&mut self, buf: &mut BytesMut) -> Result<Option<Op>, Bad> {
        let mut pairs = Vec::new();
        let mut c = Cursor {
            buf: &buf[..],
            at: 0,
        };
        let mut used = 0;
        while self.multi_set_left > 0 {
            let pair = c.key().and_then(|k| Ok((k, c.payload()?)));
            match pair {
                Ok(p) => {
                    pairs.push(p);
                    used = c.at;
                    self.multi_set_left -= 1;
                }
                Err(Stop::More) => break,
                Err(Stop::Bad(b)) => return Err(b),
            }
        }
        buf.advance(used);
        Ok((!pairs.is_empty()).then_some(Op::MultiSet { pairs }))
    }
}

/// What a parse found: a whole op, or the head of a MULTI_SET (its count).
enum Parsed {
    Op(Op),
    MultiSet(u64),
}

fn parse(c: &mut Cursor<'_>) -> Result<Parsed, Stop> {
    let op = match c.u8()? {
        0 => Op::Validate(c.u32()?),
        1 => Op::Set {
            key: c.key()?,
            value: c.payload()?,
        },
        2 => Op::CompareSet {
            key: c.key()?,
            expected: c.payload()?,
            desired: c.payload()?,
        },
        3 => Op::Get { key: c.key()? },
        4 => Op::Add {
            key: c.key()?,
            delta: c.i64()?,
        },
        5 => Op::Check { keys: c.keys()? },
        6 => Op::Wait { keys: c.keys()? },
        7 => Op::NumKeys,
        8 => Op::DeleteKey { key: c.key()? },
        9 => Op::Append {
            key: c.key()?,
            value: c.payload()?,
        },
        10 => Op::MultiGet { keys: c.keys()? },
        11 => return Ok(Parsed::MultiSet(c.count()?)),
        12 => Op::CancelWait,
        13 => Op::Ping(c.u32()?),
        14 => Op::QueuePush {
            key: c.key()?,
            value: c.payload()?,
        },
        15 => Op::QueuePop { key: c.key()? },
        16 => Op::QueueLen { key: c.key()? },
        17 => Op::ListKeys,
        18 => Op::Barrier {
            key: c.key()?,
            world_size: c.i64()?,
        },
        other => return Err(Bad::UnknownOp(other).into()),
    };
    Ok(Parsed::Op(op))
}

/// Writes a string (u64 length, then the bytes).
pub fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u64_le(b.len() as u64);
    out.put_slice(b);
}

/// Writes an i64.
pub fn put_i64(out: &mut BytesMut, v: i64) {
    out.put_i64_le(v);
}

/// The op byte of `op`.
fn op_byte(op: &Op) -> u8 {
    match op {
        Op::Validate(_) => 0,
        Op::Set { .. } => 1,
        Op::CompareSet { .. } => 2,
        Op::Get { .. } => 3,
        Op::Add { .. } => 4,
        Op::Check { .. } => 5,
        Op::Wait { .. } => 6,
        Op::NumKeys => 7,
        Op::DeleteKey { .. } => 8,
        Op::Append { .. } => 9,
        Op::MultiGet { .. } => 10,
        Op::MultiSet { .. } => 11,
        Op::CancelWait => 12,
        Op::Ping(_) => 13,
        Op::QueuePush { .. } => 14,
        Op::QueuePop { .. } => 15,
        Op::QueueLen { .. } => 16,
        Op::ListKeys => 17,
        Op::Barrier { .. } => 18,
    }
}

/// The bytes of `op` as a stock client sends it (tests, the benchmark, the
/// relay's upstream calls). A MULTI_SET is written whole, with its count.
pub fn encode(op: &Op, out: &mut BytesMut) {
    out.put_u8(op_byte(op));
    match op {
        Op::Validate(n) | Op::Ping(n) => out.put_u32_le(*n),
        Op::Set { key, value } | Op::Append { key, value } | Op::QueuePush { key, value } => {
            put_bytes(out, key.as_bytes());
            put_bytes(out, value);
        }
        Op::CompareSet {
            key,
            expected,
            desired,
        } => {
            put_bytes(out, key.as_bytes());
            put_bytes(out, expected);
            put_bytes(out, desired);
        }
        Op::Get { key } | Op::DeleteKey { key } | Op::QueuePop { key } | Op::QueueLen { key } => {
            put_bytes(out, key.as_bytes());
        }
        Op::Add { key, delta: n } | Op::Barrier { key, world_size: n } => {
            put_bytes(out, key.as_bytes());
            out.put_i64_le(*n);
        }
        Op::Check { keys } | Op::Wait { keys } | Op::MultiGet { keys } => {
            out.put_u64_le(keys.len() as u64);
            for k in keys {
                put_bytes(out, k.as_bytes());
            }
        }
        Op::MultiSet { pairs } => {
            out.put_u64_le(pairs.len() as u64);
            for (k, v) in pairs {
                put_bytes(out, k.as_bytes());
                put_bytes(out, v);
            }
        }
        Op::NumKeys | Op::CancelWait | Op::ListKeys => {}
    }
}

/// Why the handshake refused a connection.
#[derive(Debug)]
pub enum Refused {
    /// It closed before a whole handshake.
    Closed,
    /// What was wrong with it.
    Bad(&'static str),
    /// The connection broke.
    Io(std::io::Error),
}

/// The handshake as torch's libuv server reads it: the connection's first
/// read must hold the whole VALIDATE with the right number. A VALIDATE cut
/// short, or with another number, is not answered, and the connection is
/// refused when more bytes come (the server reads them as a request, and
/// VALIDATE is not one). `buf` holds what has arrived; the VALIDATE is
/// consumed, what follows it stays.
pub async fn handshake<S>(stream: &mut S, buf: &mut BytesMut) -> Result<(), Refused>
where
    S: tokio::io::AsyncRead + Unpin,
{
    if buf.is_empty() {
        match tokio::io::AsyncReadExt::read_buf(stream, buf).await {
            Ok(0) => return Err(Refused::Closed),
            Ok(_) => {}
            Err(e) => return Err(Refused::Io(e)),
        }
    }
    let whole = buf.len() >= 5 && buf[0] == 0;
    if whole && u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]) == VALIDATE_MAGIC {
        buf.advance(5);
        return Ok(());
    }
    let mut more = [0u8; 512];
    let _ = tokio::io::AsyncReadExt::read(stream, &mut more).await;
    Err(Refused::Bad(if whole {
        "a VALIDATE with a wrong number"
    } else {
        "the first read is not a whole VALIDATE"
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ops() -> Vec<Op> {
        let b = |s: &str| Bytes::from(s.to_string());
        vec![
            Op::Validate(VALIDATE_MAGIC),
            Op::Set {
                key: "/k".into(),
                value: b("v"),
            },
            Op::CompareSet {
                key: "/c".into(),
                expected: b(""),
                desired: b("d"),
            },
            Op::Get { key: "/k".into() },
            Op::Add {
                key: "/n".into(),
                delta: -2,
            },
            Op::Check {
                keys: vec!["/a".into(), "/b".into()],
            },
            Op::Wait { keys: vec![] },
            Op::NumKeys,
            Op::DeleteKey { key: "/k".into() },
            Op::Append {
                key: "/ap".into(),
                value: b("x"),
            },
            Op::MultiGet {
                keys: vec!["/a".into()],
            },
            Op::MultiSet {
                pairs: vec![("/a".into(), b("1")), ("/b".into(), b("2"))],
            },
            Op::CancelWait,
            Op::Ping(0x1234),
            Op::QueuePush {
                key: "/q".into(),
                value: b("i"),
            },
            Op::QueuePop { key: "/q".into() },
            Op::QueueLen { key: "/q".into() },
            Op::ListKeys,
            Op::Barrier {
                key: "/b".into(),
                world_size: 4,
            },
        ]
    }

    #[test]
    fn every_op_round_trips_whole_and_byte_by_byte() {
        for op in all_ops() {
            let mut wire = BytesMut::new();
            encode(&op, &mut wire);
            let mut d = Decoder::default();
            let mut whole = wire.clone();
            assert_eq!(d.decode(&mut whole), Ok(Some(op.clone())));
            assert!(whole.is_empty());
            // Dribbled one byte at a time: nothing until it is whole (a
            // MULTI_SET: its pairs as each completes).
            let mut d = Decoder::default();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for byte in wire.iter() {
                buf.put_u8(*byte);
                while let Some(o) = d.decode(&mut buf).unwrap() {
                    got.push(o);
                }
            }
            match op {
                Op::MultiSet { pairs } => {
                    let arrived: Vec<_> = got
                        .into_iter()
                        .flat_map(|o| match o {
                            Op::MultiSet { pairs } => pairs,
                            other => panic!("{other:?}"),
                        })
                        .collect();
                    assert_eq!(arrived, pairs);
                }
                op => assert_eq!(got, vec![op]),
            }
        }
    }

    #[test]
    fn limits_act_on_the_length_before_its_body() {
        let mut d = Decoder::default();
        let mut buf = BytesMut::new();
        buf.put_u8(1);
        buf.put_u64_le(MAX_KEY_BYTES as u64 + 1);
        assert_eq!(
            d.decode(&mut buf),
            Err(Bad::KeyTooLong(MAX_KEY_BYTES as u64 + 1))
        );
        let mut buf = BytesMut::new();
        buf.put_u8(1);
        put_bytes(&mut buf, b"/k");
        buf.put_u64_le(MAX_VALUE_BYTES as u64 + 1);
        assert!(matches!(d.decode(&mut buf), Err(Bad::ValueTooLong(_))));
        let mut buf = BytesMut::new();
        buf.put_u8(6);
        buf.put_u64_le(MAX_KEY_COUNT + 1);
        assert!(matches!(d.decode(&mut buf), Err(Bad::TooManyKeys(_))));
        let mut buf = BytesMut::from(&[19u8][..]);
        assert_eq!(d.decode(&mut buf), Err(Bad::UnknownOp(19)));
        // The largest key torch accepts is accepted.
        let mut buf = BytesMut::new();
        buf.put_u8(3);
        put_bytes(&mut buf, "k".repeat(MAX_KEY_BYTES).as_bytes());
        assert!(matches!(d.decode(&mut buf), Ok(Some(Op::Get { .. }))));
    }

    #[test]
    fn a_multi_set_is_handed_out_pair_by_pair_as_it_arrives() {
        let mut wire = BytesMut::new();
        let pairs = vec![
            ("/a".to_string(), Bytes::from_static(b"1")),
            ("/b".to_string(), Bytes::from_static(b"2")),
        ];
        encode(&Op::MultiSet { pairs }, &mut wire);
        // Cut one byte short: the first pair is out, the second waits.
        let mut buf = BytesMut::from(&wire[..wire.len() - 1]);
        let mut d = Decoder::default();
        assert_eq!(
            d.decode(&mut buf),
            Ok(Some(Op::MultiSet {
                pairs: vec![("/a".into(), Bytes::from_static(b"1"))]
            }))
        );
        assert_eq!(d.decode(&mut buf), Ok(None));
        buf.put_u8(b'2');
        assert_eq!(
            d.decode(&mut buf),
            Ok(Some(Op::MultiSet {
                pairs: vec![("/b".into(), Bytes::from_static(b"2"))]
            }))
        );
        // A count of 0 is a MULTI_SET of nothing.
        let mut buf = BytesMut::new();
        encode(&Op::MultiSet { pairs: vec![] }, &mut buf);
        assert_eq!(d.decode(&mut buf), Ok(Some(Op::MultiSet { pairs: vec![] })));
    }
}
