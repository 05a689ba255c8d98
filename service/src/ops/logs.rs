//! Log lines: one per event on stderr, as text or JSON (`--log-format`),
//! each with this node's id, Raft term and role once the node runs.

use std::fmt;
use std::sync::{Arc, OnceLock};

use raft::RaftNode;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// `TIME LEVEL node=N term=T role=R target: message key=value ...`
    Text,
    /// One JSON object per line: `ts`, `level`, `target`, `node_id`,
    /// `term`, `role`, `message` and the event's fields.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("--log-format is text or json, not {other:?}")),
        }
    }
}

/// openraft's notices that a message sent under an earlier vote was
/// ignored: every election (a node's first one included) produces them,
/// and they report openraft working as designed, not trouble. openraft
/// logs them at WARN; they are dropped here, so a clean start shows no
/// warning and a WARN line means something.
const STALE_MESSAGE_NOTICES: [&str; 1] = ["A message will be ignored because "];

/// The layer that drops openraft's stale-message notices (see
/// [`STALE_MESSAGE_NOTICES`]); every other event passes.
pub struct QuietNotices;

impl<S: Subscriber> tracing_subscriber::Layer<S> for QuietNotices {
    fn event_enabled(
        &self,
        event: &Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let m = event.metadata();
        if *m.level() != tracing::Level::WARN || m.target() != "openraft::core::raft_core" {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        !STALE_MESSAGE_NOTICES
            .iter()
            .any(|p| fields.message.starts_with(p))
    }
}

static NODE: OnceLock<Arc<RaftNode>> = OnceLock::new();

/// From now on every line names `node`'s id, term and role.
pub fn set_node(node: Arc<RaftNode>) {
    let _ = NODE.set(node);
}

/// The event formatter of `format`.
pub struct NodeLines(pub LogFormat);

#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(String, serde_json::Value)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest
                .push((field.name().into(), format!("{value:?}").into()));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.into();
        } else {
            self.rest.push((field.name().into(), value.into()));
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest.push((field.name().into(), value.into()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest.push((field.name().into(), value.into()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest.push((field.name().into(), value.into()));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.rest.push((field.name().into(), value.into()));
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}

impl<S, N> FormatEvent<S, N> for NodeLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let node = NODE.get().map(|n| {
            let m = n.metrics();
            (n.id(), m.current_term, n.role().as_str())
        });
        match self.0 {
            LogFormat::Json => {
                let mut o = serde_json::Map::new();
                o.insert("ts".into(), now_rfc3339().into());
                o.insert("level".into(), meta.level().as_str().into());
                o.insert("target".into(), meta.target().into());
                if let Some((id, term, role)) = node {
                    o.insert("node_id".into(), id.into());
                    o.insert("term".into(), term.into());
                    o.insert("role".into(), role.into());
                }
                o.insert("message".into(), fields.message.into());
                for (k, v) in fields.rest {
                    o.entry(k).or_insert(v);
                }
                writeln!(w, "{}", serde_json::Value::Object(o))
            }
            LogFormat::Text => {
                write!(w, "{} {:>5} ", now_rfc3339(), meta.level())?;
                if let Some((id, term, role)) = node {
                    write!(w, "node={id} term={term} role={role} ")?;
                }
                write!(w, "{}: {}", meta.target(), fields.message)?;
                for (k, v) in fields.rest {
                    match v {
                        serde_json::Value::String(s) => write!(w, " {k}={s}")?,
                        v => write!(w, " {k}={v}")?,
                    }
                }
                writeln!(w)
            }
        }
    }
}
