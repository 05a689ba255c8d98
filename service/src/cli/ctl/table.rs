//! `ctl ... -o table`: what the JSON of a listing verb says, as aligned
//! columns a person scans — the few that answer "what is going on" (the
//! JSON keeps everything, for scripts). Each renderer reads the verb's own
//! JSON, so the two never disagree. A cell shows a string from a user (a
//! key, a value, an error message) with its control characters escaped, so
//! nothing it holds can move the terminal's cursor or change its colours.

use serde_json::Value;

/// Longest a cell gets before it is cut (with `…`).
const CELL_CHARS: usize = 96;

/// Rows of cells under a header, aligned on render.
pub struct Table {
    head: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// Columns aligned to the right (numbers).
    right: Vec<usize>,
}

impl Table {
    /// A table with the columns `head`.
    pub fn new(head: &[&'static str]) -> Table {
        Table {
            head: head.to_vec(),
            rows: Vec::new(),
            right: Vec::new(),
        }
    }

    /// The same table with columns `cols` aligned to the right.
    pub fn right(mut self, cols: &[usize]) -> Table {
        self.right = cols.to_vec();
        self
    }

    /// Adds a row (cells beyond the header are dropped, missing ones empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table, each line indented by `indent`; trailing blanks trimmed.
    pub fn render_indented(&self, indent: &str) -> String {
        let n = self.head.len();
        let cells = |r: &Vec<String>| -> Vec<String> {
            (0..n)
                .map(|i| r.get(i).cloned().unwrap_or_default())
                .collect()
        };
        let head: Vec<String> = self.head.iter().map(|h| h.to_string()).collect();
        let rows: Vec<Vec<String>> = std::iter::once(head)
            .chain(self.rows.iter().map(cells))
            .collect();
        let width: Vec<usize> = (0..n)
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in &rows {
            let mut line = indent.to_string();
            for (i, c) in r.iter().enumerate() {
                let pad = width[i] - c.chars().count();
                if self.right.contains(&i) {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(c);
                } else {
                    line.push_str(c);
                    line.push_str(&" ".repeat(pad));
                }
                line.push_str("  ");
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// The table, aligned.
    pub fn render(&self) -> String {
        self.render_indented("")
    }
}

/// `s` as a cell: control characters escaped, cut at [`CELL_CHARS`].
pub fn cell(s: &str) -> String {
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i == CELL_CHARS {
            out.push('…');
            break;
        }
        if ch.is_control() {
            out.extend(ch.escape_default());
        } else {
            out.push(ch);
        }
    }
    out
}

/// A JSON value as a cell: a string as [`cell`], null as `-`.
pub fn val(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => cell(s),
        other => cell(&other.to_string()),
    }
}

/// A duration in ms, short: `850ms`, `12.4s`, `4m12s`, `3h04m`, `2d03h`;
/// `-` for none.
pub fn duration(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    let s = ms / 1000;
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..=86_399_999 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Bytes, short: `512B`, `1.2KiB`, `48MiB`.
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b}B");
    }
    let mut v = b as f64;
    let mut unit = "";
    for u in UNITS {
        v /= 1024.0;
        unit = u;
        if v < 1024.0 {
            break;
        }
    }
    if v < 10.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.0}{unit}")
    }
}

/// A JSON number field, 0 if absent.
pub fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// A JSON ms field as a [`duration`].
pub fn ms(v: &Value, key: &str) -> String {
    duration(v[key].as_u64())
}

/// `used/quota` (just `used` without a quota), each through `show`.
pub fn against(used: u64, quota: &Value, show: impl Fn(u64) -> String) -> String {
    match quota.as_u64() {
        Some(q) => format!("{}/{}", show(used), show(q)),
        None => show(used),
    }
}

/// A task of the diagnostics' JSON as `JOB/ID` (what `ctl tasks TASK` takes).
pub fn task_ref(t: &Value) -> String {
    cell(&format!(
        "{}/{}",
        t["job"].as_str().unwrap_or(""),
        t["task_id"].as_i64().unwrap_or(-1)
    ))
}

/// When a task was last heard of, as the diagnostics' JSON says.
pub fn heard(t: &Value) -> String {
    if let Some(ms) = t["heartbeat_age_ms"].as_u64() {
        return format!("{} ago", duration(Some(ms)));
    }
    if let Some(ms) = t["disconnected_age_ms"].as_u64() {
        return format!("disconnected {} ago", duration(Some(ms)));
    }
    match t["state"].as_str() {
        Some("DISCONNECTED") => "never connected".into(),
        _ => "-".into(),
    }
}

/// `key: value` lines, aligned on the colon.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{k:<w$}  {v}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_cells_are_inert() {
        let mut t = Table::new(&["NAME", "N"]).right(&[1]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec![cell("b\u{1b}[31m\nc"), "100".into()]);
        let out = t.render();
        assert_eq!(
            out,
            "NAME              N\na                 1\nb\\u{1b}[31m\\nc  100\n"
        );
        assert!(!out.contains('\u{1b}'));
        assert_eq!(cell(&"x".repeat(200)).chars().count(), CELL_CHARS + 1);
    }

    #[test]
    fn durations_and_bytes_are_short() {
        assert_eq!(duration(None), "-");
        assert_eq!(duration(Some(850)), "850ms");
        assert_eq!(duration(Some(12_400)), "12.4s");
        assert_eq!(duration(Some(252_000)), "4m12s");
        assert_eq!(duration(Some(16_440_000)), "4h34m");
        assert_eq!(duration(Some(183_600_000)), "2d03h");
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1300), "1.3KiB");
        assert_eq!(bytes(48 << 20), "48MiB");
    }
}
