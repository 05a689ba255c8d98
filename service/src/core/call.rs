//! The call context: what the front door learns about a call once, from its
//! gRPC metadata, and hands down to whatever runs it — its exactly-once
//! origin, the job epoch in which its task names were resolved, its
//! deadline, whether another node forwarded it, and its namespace. An
//! origin is parsed, stamped and converted between its wire form
//! ([`proto::origin::WireOrigin`], the [`ORIGIN_HEADER`]) and its journal
//! form (`journal::pb::Origin`) here and nowhere else.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use journal::pb::{update::Command, DomainError, Origin};
use journal::Update;
use proto::origin::{Lane, Lanes, WireOrigin};
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

pub use proto::ORIGIN_HEADER;

/// gRPC metadata key marking a call forwarded by another node; such a call
/// is never forwarded again (no forwarding loops while leadership moves).
/// A client can set it too: all it gets is an UNAVAILABLE from a follower.
pub const FORWARDED: &str = "x-coordstore-forwarded";

/// The namespace of a call that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// One call's context (cloned for each attempt of a call retried on the
/// leader).
#[derive(Clone, Debug)]
pub struct Call {
    origin: Option<Origin>,
    /// The job epoch of the call's first task name resolution.
    named_in: OnceLock<u64>,
    deadline: Option<Instant>,
    forwarded: bool,
    namespace: String,
}

impl Call {
    /// The context of `req`: its origin (a malformed [`ORIGIN_HEADER`] is
    /// INVALID_ARGUMENT before anything happens), its deadline
    /// (`grpc-timeout`), and whether a node forwarded it.
    pub fn from_request<T>(req: &Request<T>) -> Result<Call, Status> {
        let md = req.metadata();
        Ok(Call {
            origin: header_origin(md)?,
            named_in: OnceLock::new(),
            deadline: grpc_timeout(md).map(|t| Instant::now() + t),
            forwarded: md.contains_key(FORWARDED),
            namespace: DEFAULT_NAMESPACE.to_string(),
        })
    }

    /// A call this node makes itself (a tool, a test): no origin, not
    /// forwarded, no deadline.
    pub fn local() -> Call {
        Call {
            origin: None,
            named_in: OnceLock::new(),
            deadline: None,
            forwarded: false,
            namespace: DEFAULT_NAMESPACE.to_string(),
        }
    }

    /// The caller's exactly-once origin, if it sent one.
    pub fn origin(&self) -> Option<Origin> {
        self.origin
    }

    /// Whether a node forwarded this call (it is not forwarded again).
    pub fn forwarded(&self) -> bool {
        self.forwarded
    }

    /// When the caller stops waiting, if it said.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The namespace the call acts in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Records that the call resolved a task name in job `epoch`; only the
    /// first resolution counts (see [`Call::epoch`]).
    pub fn named_in(&self, epoch: u64) {
        let _ = self.named_in.set(epoch);
    }

    /// The job epoch in which the call's task names were resolved: its
    /// updates carry it, so a call that raced a job reset is refused instead
    /// of landing on whatever task has the index now.
    pub fn epoch(&self) -> Option<u64> {
        self.named_in.get().copied()
    }

    /// The update of `command` for this call: its origin and epoch.
    pub fn update(&self, command: impl Into<Command>) -> Update {
        Update {
            origin: self.origin,
            epoch: self.epoch(),
            command: Some(command.into()),
            ..Default::default()
        }
    }

    /// This call with an origin: the caller's, or one drawn on a lane of
    /// `lanes` (held until the returned lane drops, when the call is over).
    /// Every attempt of the call, here or forwarded, then carries it.
    pub fn with_origin(&self, lanes: &Lanes) -> (Call, Option<Lane>) {
        let (origin, lane) = match self.origin {
            Some(o) => (o, None),
            None => {
                let lane = lanes.checkout();
                (journal_origin(lane.origin()), Some(lane))
            }
        };
        let call = Call {
            origin: Some(origin),
            named_in: self.named_in.clone(),
            deadline: self.deadline,
            forwarded: self.forwarded,
            namespace: self.namespace.clone(),
        };
        (call, lane)
    }

    /// `msg` as this call forwarded to the leader: marked forwarded, with
    /// the call's origin.
    pub fn forward<M>(&self, msg: M) -> Request<M> {
        let mut req = forwarded(msg);
        if let Some(o) = self.origin {
            if let Ok(v) = wire_origin(o).header_value().parse() {
                req.metadata_mut().insert(ORIGIN_HEADER, v);
            }
        }
        req
    }
}

/// A request marked as forwarded by this node.
pub fn forwarded<T>(msg: T) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert(FORWARDED, "1".parse().expect("ascii"));
    req
}

/// Gives `u` an origin on a lane of `lanes` if it has none; the lane is
/// held until the returned guard drops (when the call is over).
pub fn stamp(u: &mut Update, lanes: &Lanes) -> Option<Lane> {
    if u.origin.is_some() {
        return None;
    }
    let lane = lanes.checkout();
    u.origin = Some(journal_origin(lane.origin()));
    Some(lane)
}

/// The origin `md` carries in [`ORIGIN_HEADER`], if any
/// (`CLIENT_ID:SEQ[:DONE_BELOW]`, see [`proto::origin`]).
fn header_origin(md: &MetadataMap) -> Result<Option<Origin>, Status> {
    let Some(v) = md.get(ORIGIN_HEADER) else {
        return Ok(None);
    };
    let text = v.to_str().map_err(|_| {
        Status::invalid_argument(format!(
            "malformed {ORIGIN_HEADER} header (want CLIENT_ID:SEQ[:DONE_BELOW])"
        ))
    })?;
    let o = WireOrigin::parse(text)
        .map_err(|e| Status::invalid_argument(format!("{ORIGIN_HEADER} header: {e}")))?;
    Ok(Some(journal_origin(o)))
}

fn journal_origin(o: WireOrigin) -> Origin {
    Origin {
        client_id: o.client_id,
        seq: o.seq,
        done_below: o.done_below,
    }
}

fn wire_origin(o: Origin) -> WireOrigin {
    WireOrigin {
        client_id: o.client_id,
        seq: o.seq,
        done_below: o.done_below,
    }
}

/// The caller's timeout from `grpc-timeout` (gRPC over HTTP/2: up to eight
/// digits and a unit, H M S m u n).
fn grpc_timeout(md: &MetadataMap) -> Option<Duration> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A failed call: the state machine's answer (mapped to the dialect's wire
/// error) or a transport-level status (no leader, shutting down).
#[derive(Debug)]
pub enum CallError {
    /// The state machine's answer.
    Domain(DomainError),
    /// The call could not be carried out.
    Status(Status),
}

impl From<Status> for CallError {
    fn from(s: Status) -> Self {
        CallError::Status(s)
    }
}

impl From<DomainError> for CallError {
    fn from(e: DomainError) -> Self {
        CallError::Domain(e)
    }
}

/// The result of a call.
pub type CallResult<T> = Result<T, CallError>;

impl CallError {
    /// The wire status, domain errors encoded by `domain`.
    pub fn into_status(self, domain: impl FnOnce(&DomainError) -> Status) -> Status {
        match self {
            CallError::Domain(d) => domain(&d),
            CallError::Status(s) => s,
        }
    }
}

/// A reply an outcome must carry; its absence is a bug between this
/// service and the journal, not the caller's.
pub fn required<T>(value: Option<T>, call: &str) -> CallResult<T> {
    value.ok_or_else(|| {
        CallError::Status(Status::internal(format!(
            "the journal answered {call} without its result"
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_reads_its_origin_deadline_and_forward_marker_once() {
        let mut req = Request::new(());
        req.metadata_mut()
            .insert(ORIGIN_HEADER, "7:3:2".parse().unwrap());
        req.metadata_mut()
            .insert("grpc-timeout", "1500m".parse().unwrap());
        let c = Call::from_request(&req).unwrap();
        assert_eq!(
            c.origin(),
            Some(Origin {
                client_id: 7,
                seq: 3,
                done_below: 2
            })
        );
        assert!(!c.forwarded());
        let left = c.deadline().unwrap() - Instant::now();
        assert!(left <= Duration::from_millis(1500) && left > Duration::from_millis(1000));
        // A forward carries the origin and the marker.
        let f = c.forward(());
        assert_eq!(f.metadata().get(ORIGIN_HEADER).unwrap(), "7:3:2");
        assert!(Call::from_request(&f).unwrap().forwarded());
    }

    #[test]
    fn a_malformed_origin_is_invalid_argument() {
        let mut req = Request::new(());
        req.metadata_mut()
            .insert(ORIGIN_HEADER, "7".parse().unwrap());
        let e = Call::from_request(&req).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn the_first_task_resolution_fixes_the_epoch() {
        let c = Call::local();
        assert_eq!(c.epoch(), None);
        c.named_in(4);
        c.named_in(5);
        assert_eq!(c.epoch(), Some(4));
        assert_eq!(c.update(Command::Noop(journal::pb::Noop {})).epoch, Some(4));
    }

    #[test]
    fn a_call_without_an_origin_gets_one_on_a_lane() {
        let lanes = Lanes::new();
        let (c, lane) = Call::local().with_origin(&lanes);
        let o = c.origin().unwrap();
        assert_eq!(o.seq, 1);
        assert!(lane.is_some());
        let mut u = c.update(Command::Noop(journal::pb::Noop {}));
        assert!(stamp(&mut u, &lanes).is_none(), "it has one already");
    }
}
