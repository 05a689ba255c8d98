//! Counters as torch's server reads and writes them: ADD parses the stored
//! value with C's `std::stoll` rules and stores the sum as canonical
//! decimal (`docs/pytorch.md`, Counters).

/// The value `std::stoll` reads from `bytes`: leading white space (space,
/// `\t`, `\n`, `\v`, `\f`, `\r`) skipped, an optional sign, then at least
/// one decimal digit, up to the first byte that is not one (the rest is
/// ignored). `None` where `stoll` throws: no digit (`invalid_argument`) or
/// a value outside `i64` (`out_of_range`).
pub fn stoll(bytes: &[u8]) -> Option<i64> {
    let mut rest = bytes;
    while let [b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r', tail @ ..] = rest {
        rest = tail;
    }
    let negative = match rest {
        [b'-', tail @ ..] => {
            rest = tail;
            true
        }
        [b'+', tail @ ..] => {
            rest = tail;
            false
        }
        _ => false,
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    // Accumulate as a negative number: i64::MIN has no positive twin.
    let mut value: i64 = 0;
    for &d in &rest[..digits] {
        value = value.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative {
        Some(value)
    } else {
        value.checked_neg()
    }
}

/// The sum ADD stores: `delta` plus the stored value (missing: 0), wrapping
/// as torch's signed addition does on the machines it runs on; `None` when
/// the stored value is not a number to `stoll`.
pub fn add(stored: Option<&[u8]>, delta: i64) -> Option<i64> {
    match stored {
        None => Some(delta),
        Some(v) => stoll(v).map(|old| old.wrapping_add(delta)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_like_stoll() {
        // Each row measured against torch 2.15's server (ADD 1 on the value).
        let rows: [(&[u8], Option<i64>); 16] = [
            (b"7", Some(7)),
            (b" 7", Some(7)),
            (b"\t\n8", Some(8)),
            (b"+5", Some(5)),
            (b"-0", Some(0)),
            (b"12abc", Some(12)),
            (b"3.9", Some(3)),
            (b"0x10", Some(0)),
            (b"4\n", Some(4)),
            (b"", None),
            (b"abc", None),
            (b"\x00\x01", None),
            (b"99999999999999999999", None),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"9223372036854775808", None),
        ];
        for (input, want) in rows {
            assert_eq!(stoll(input), want, "{input:?}");
        }
    }

    #[test]
    fn adds_wrapping() {
        assert_eq!(add(None, -2), Some(-2));
        assert_eq!(add(Some(b"9223372036854775807"), 1), Some(i64::MIN));
        assert_eq!(add(Some(b"x"), 1), None);
    }
}
