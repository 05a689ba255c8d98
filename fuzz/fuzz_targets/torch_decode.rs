//! PyTorch's TCPStore decoder (`proto::torch`): arbitrary bytes, fed in
//! arbitrary chunks, never panic it; every request it hands out re-encodes
//! to bytes it decodes to the same request, and it never asks for more
//! than torch's limits allow.
#![no_main]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use proto::torch::{encode, Decoder, Op};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, body)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = Decoder::default();
    let mut buf = BytesMut::new();
    for piece in body.chunks(chunk) {
        buf.put_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(op)) => round_trip(&op),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});

/// A whole request re-encoded decodes to itself.
fn round_trip(op: &Op) {
    let mut wire = BytesMut::new();
    encode(op, &mut wire);
    let again = Decoder::default().decode(&mut wire);
    // (A MULTI_SET comes out in parts; re-encoded, a part is one whole.)
    assert_eq!(again, Ok(Some(op.clone())));
    assert!(wire.is_empty());
}
