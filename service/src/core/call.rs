//! The call context: what the front door learns about a call once and hands
//! down to whatever runs it — its exactly-once origin, the job epoch in
//! which its task names were resolved, its deadline, whether another node
//! forwarded it, its namespace, and who the client is (its certificate).
//!
//! A [`Call`] is a plain value any transport builds from a
//! [`CallContext`]: the gRPC dialects from a request's metadata
//! (`crate::wire::context`), a raw TCP protocol from its connection (its
//! port's namespace, the session's origins). An origin is converted between
//! its wire form ([`proto::origin::WireOrigin`], the [`ORIGIN_HEADER`]) and
//! its journal form (`journal::pb::Origin`) here and nowhere else.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use journal::pb::{update::Command, DomainError, Origin};
use journal::Update;
use proto::origin::{Lane, Lanes, WireOrigin};
use tonic::transport::CertificateDer;
use tonic::Status;

pub use proto::ORIGIN_HEADER;

/// The namespace of a call that names none.
pub const DEFAULT_NAMESPACE: &str = journal::DEFAULT_NAMESPACE;

pub use proto::NAMESPACE_HEADER;

/// The cluster's admin identity: which client certificates may run the
/// cluster verbs (namespace create, delete, reset, export and import,
/// reset-job, snapshot save, membership changes) and see every namespace.
#[derive(Clone, Debug, Default)]
pub struct Admins {
    /// Calls carry an identity: the client port requires a certificate its
    /// client CA signed (`--tls-client-ca`). Without one no call has an
    /// identity, and every call is admitted to every verb.
    pub identities: bool,
    /// The admins' certificate names (`--admin-client-name`; subject CN or
    /// a SAN, `*` matching any run of characters). None: with identities,
    /// no client may run a cluster verb.
    pub names: Vec<String>,
}

/// What a call needs to be admitted (see `Core::admit`): the one rule every
/// service's calls pass, chosen per dialect and method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access<'a> {
    /// Anyone who reached the port: the node's status, a read index.
    Open,
    /// The call's namespace: it exists, and admits the client (its
    /// allow-list, or an admin).
    Namespace,
    /// The call's namespace as [`Access::Namespace`], and configured (its
    /// job's settings applied): what a coordination dialect's calls wait
    /// for at a fresh cluster's start.
    Configured,
    /// A cluster verb, named for the refusal: admins only.
    Cluster(&'a str),
    /// A plaintext TCPStore connection on a port with TLS (torch's client
    /// has no TLS): the call's namespace exists and lets plaintext TCPStore
    /// in — its own `torch_plaintext`, or for the default namespace
    /// `default_leave` (the main port's `--torch-plaintext`). The
    /// allow-list does not apply: such a client has no certificate, and
    /// letting it in is the namespace's own choice.
    Plaintext {
        /// The main port's leave, for the default namespace.
        default_leave: bool,
    },
    /// A journal update proposed from outside (the Node API: ctl, tools,
    /// other nodes' forwards), admitted as its command's kind says.
    Update(UpdateKind),
    /// A membership change: a cluster verb (named for the refusal) that
    /// also needs the cluster's peer token, when it has one.
    Membership(&'a str),
    /// A node-to-node call (a read index, a forwarded heartbeat): on a node
    /// whose peers have a port of their own, only there; on a node whose
    /// peers share its one port, admitted as the inner access says (a
    /// heartbeat names a task of a namespace, which must admit the caller).
    Peer(&'a Access<'a>),
}

/// What kind of journal command an update from outside carries (the
/// journal knows; admission decides what each kind needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateKind {
    /// A command a client may issue: admitted to its namespace.
    Client,
    /// A cluster verb (a job epoch reset): admins only.
    ClusterVerb(&'static str),
    /// Bookkeeping a node proposes for the clients it holds (a PyTorch
    /// store connection's closing, its being alive): from another node
    /// only, through `NodePeer` (see [`Access::Peer`]); anywhere else as
    /// [`UpdateKind::LeaderRuntime`].
    Node,
    /// A command only the leader runtime proposes (timers, liveness):
    /// never from outside, whatever headers the request carries.
    LeaderRuntime,
}

impl UpdateKind {
    /// The kind of `command`: each area's allow-list
    /// (`journal::client_proposable`: a command added later is refused
    /// until it is listed there).
    pub fn of(command: &Command) -> UpdateKind {
        match command {
            Command::ResetJobEpoch(_) => UpdateKind::ClusterVerb("reset-job"),
            c if journal::client_proposable(c) => UpdateKind::Client,
            c if journal::node_proposable(c) => UpdateKind::Node,
            _ => UpdateKind::LeaderRuntime,
        }
    }
}

/// The peer credentials a request presented (the peer token and cluster id
/// headers), read only by the admission of a call that needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer token presented, if any.
    pub token: Option<Vec<u8>>,
    /// The cluster id presented, if any.
    pub cluster: Option<Vec<u8>>,
}

/// What a transport knows of a call when it arrives; [`Call::new`] makes
/// the call of it.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    /// The namespace it acts in (`None`: the default one).
    pub namespace: Option<String>,
    /// The caller's exactly-once origin, if it sent one.
    pub origin: Option<Origin>,
    /// When the caller stops waiting, if it said.
    pub deadline: Option<Instant>,
    /// Another node forwarded it (it is not forwarded again).
    pub forwarded: bool,
    /// The client's certificate chain (TLS), if it presented one.
    pub peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    /// It arrived on the peer port: the node that took it from its client
    /// admitted it.
    pub from_peer: bool,
    /// Its client sends it again to another node when this one answers
    /// UNAVAILABLE: it brought its own exactly-once origin (the relay, the
    /// agents) or another node forwarded it. A node that cannot serve now
    /// (its disk or Raft core stalled) fails such a call at once instead of
    /// holding it.
    pub retried_elsewhere: bool,
    /// The peer token and cluster id it presented, if it presented any.
    pub peer_credentials: Option<Arc<PeerCredentials>>,
}

/// One call's context (cloned for each attempt of a call retried on the
/// leader).
#[derive(Clone, Debug)]
pub struct Call {
    origin: Option<Origin>,
    /// The job epoch of the call's first task name resolution.
    named_in: OnceLock<u64>,
    deadline: Option<Instant>,
    forwarded: bool,
    /// Borrowed for the default namespace (no allocation on its calls).
    namespace: Cow<'static, str>,
    /// The client's certificate chain (mutual TLS), if it presented one.
    peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    /// The names of its certificate (subject CN and SANs), read only when a
    /// namespace with an allow-list asks; `None` without one.
    client_names: OnceLock<Option<Vec<String>>>,
    /// Admitted already: it arrived on the peer port (the node that took it
    /// from its client admitted it), or this node makes it itself
    /// ([`Call::internal`]). No allow-list or cluster-verb check applies.
    admitted: bool,
    /// See [`CallContext::retried_elsewhere`].
    retried_elsewhere: bool,
    /// See [`CallContext::peer_credentials`].
    peer_credentials: Option<Arc<PeerCredentials>>,
}

impl Call {
    /// The call a transport describes in `ctx`.
    pub fn new(ctx: CallContext) -> Call {
        let namespace = match ctx.namespace {
            None => Cow::Borrowed(DEFAULT_NAMESPACE),
            Some(n) if n == DEFAULT_NAMESPACE => Cow::Borrowed(DEFAULT_NAMESPACE),
            Some(n) => Cow::Owned(n),
        };
        Call {
            origin: ctx.origin,
            named_in: OnceLock::new(),
            deadline: ctx.deadline,
            forwarded: ctx.forwarded,
            namespace,
            peer_certs: ctx.peer_certs,
            client_names: OnceLock::new(),
            admitted: ctx.from_peer,
            retried_elsewhere: ctx.retried_elsewhere,
            peer_credentials: ctx.peer_credentials,
        }
    }

    /// The peer credentials it presented (none: nothing presented).
    pub fn peer_credentials(&self) -> PeerCredentials {
        self.peer_credentials
            .as_deref()
            .cloned()
            .unwrap_or_default()
    }

    /// Whether it was admitted already (see [`Call::internal`]; it arrived
    /// on the peer port).
    pub fn is_admitted(&self) -> bool {
        self.admitted
    }

    /// Whether its client sends it to another node when this one answers
    /// UNAVAILABLE (see [`CallContext::retried_elsewhere`]).
    pub fn retried_elsewhere(&self) -> bool {
        self.retried_elsewhere
    }

    /// A call this node makes itself (its status page, its readiness
    /// check, a duty, a test): admitted already (no client stands behind
    /// it), no origin, not forwarded, no deadline.
    pub fn internal() -> Call {
        Call {
            admitted: true,
            ..Call::new(CallContext::default())
        }
    }

    /// The call of request `seq` of the session whose admitted call this
    /// is (a TCPStore connection: its origin's client id names the
    /// session): the same namespace, client, deadline and admission, with
    /// origin `(client id, seq)`, every earlier request done (`seq` 0: a
    /// read, which applies nothing).
    pub fn request(&self, seq: u64) -> Call {
        let client_id = self.origin.map_or(0, |o| o.client_id);
        debug_assert!(client_id != 0, "a session's call carries its id");
        Call {
            origin: Some(Origin {
                client_id,
                seq,
                done_below: seq,
            }),
            named_in: OnceLock::new(),
            ..self.clone()
        }
    }

    /// This call as session `id`'s (see [`Call::request`]).
    pub fn in_session(mut self, id: u64) -> Call {
        self.origin = Some(Origin {
            client_id: id,
            seq: 0,
            done_below: 0,
        });
        self
    }

    /// Whether a namespace that admits clients named `allow` (subject CN or
    /// a SAN of their certificate; `*` matches any run of characters; none:
    /// any client) admits this call: PERMISSION_DENIED naming the namespace
    /// if not. The cluster's admins are admitted to every namespace; a call
    /// a peer forwarded was admitted where it arrived.
    pub fn admit(&self, allow: &[String], admins: &Admins) -> Result<(), DomainError> {
        if self.admits(allow, admins) {
            return Ok(());
        }
        let why = match self.client_names() {
            None => format!(
                "it admits only clients with a certificate named {allow:?}; this call presented none"
            ),
            Some(names) => format!(
                "it admits only clients with a certificate named {allow:?}; this client's certificate names {names:?}"
            ),
        };
        Err(journal::namespace::not_admitted(&self.namespace, &why))
    }

    /// Whether a namespace that admits clients named `allow` admits this
    /// call (see [`Call::admit`]).
    pub fn admits(&self, allow: &[String], admins: &Admins) -> bool {
        allow.is_empty() || self.admitted || self.named(allow) || self.named_admin(admins)
    }

    /// Admits this call to cluster verb `verb` (namespace lifecycle,
    /// reset-job, snapshot save, membership): with client certificates
    /// required only an admin may run one; PERMISSION_DENIED naming the verb
    /// and the certificate's names if not. Without client certificates a
    /// call has no identity and every call is admitted (the network is the
    /// boundary). A call a peer forwarded was admitted where it arrived.
    pub fn admit_cluster_verb(&self, verb: &str, admins: &Admins) -> CallResult<()> {
        if self.admitted || !admins.identities || self.named_admin(admins) {
            return Ok(());
        }
        let names = match self.client_names() {
            Some(names) => format!("this client's certificate names {names:?}"),
            None => "this call presented no certificate".to_string(),
        };
        let admins = match admins.names.as_slice() {
            [] => "this cluster names no admin (--admin-client-name), so no client may".to_string(),
            list => format!("only an admin (a certificate named {list:?}) may"),
        };
        Err(Status::permission_denied(format!(
            "{verb} is a cluster verb: {admins} run it; {names}"
        ))
        .into())
    }

    /// Whether the client's certificate names one of `patterns`.
    fn named(&self, patterns: &[String]) -> bool {
        self.client_names()
            .is_some_and(|names| names.iter().any(|n| patterns.iter().any(|p| glob(p, n))))
    }

    /// Whether the call has an identity (client certificates are required)
    /// and it is one of the cluster's admins.
    fn named_admin(&self, admins: &Admins) -> bool {
        admins.identities && self.named(&admins.names)
    }

    /// The names of the client's certificate (subject CN and SANs); `None`
    /// without one.
    fn client_names(&self) -> Option<&[String]> {
        self.client_names
            .get_or_init(|| {
                let certs = self.peer_certs.as_ref()?;
                Some(certs.first().map(|c| cert_names(c)).unwrap_or_default())
            })
            .as_deref()
    }

    /// This call acting in namespace `name` instead.
    pub fn in_namespace(mut self, name: &str) -> Call {
        self.namespace = if name == DEFAULT_NAMESPACE {
            Cow::Borrowed(DEFAULT_NAMESPACE)
        } else {
            Cow::Owned(name.to_string())
        };
        self
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

    /// The namespace the call acts in (`default` if it names none).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// How the state keys the call's namespace ("" for the default one).
    pub fn namespace_key(&self) -> &str {
        journal::namespace::namespace_key(&self.namespace)
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

    /// The update of `command` for this call: its origin, epoch and
    /// namespace.
    pub fn update(&self, command: impl Into<Command>) -> Update {
        Update {
            origin: self.origin,
            epoch: self.epoch(),
            namespace: self.namespace_key().to_string(),
            command: Some(command.into()),
            ..Default::default()
        }
    }

    /// This call with an origin: the caller's, or one drawn on a lane of
    /// `lanes` (held until the returned lane drops, when the call is over).
    /// Every attempt of the call, here or forwarded, then carries it. Only
    /// the router draws origins (`Router::exactly_once`).
    pub(super) fn with_origin(&self, lanes: &Lanes) -> (Call, Option<Lane>) {
        let (origin, lane) = match self.origin {
            Some(o) => (o, None),
            None => {
                let lane = lanes.checkout();
                (journal_origin(lane.origin()), Some(lane))
            }
        };
        let call = Call {
            origin: Some(origin),
            ..self.clone()
        };
        (call, lane)
    }
}

/// An origin's journal form.
pub fn journal_origin(o: WireOrigin) -> Origin {
    Origin {
        client_id: o.client_id,
        seq: o.seq,
        done_below: o.done_below,
    }
}

/// An origin's wire form (the [`ORIGIN_HEADER`]'s).
pub fn wire_origin(o: Origin) -> WireOrigin {
    WireOrigin {
        client_id: o.client_id,
        seq: o.seq,
        done_below: o.done_below,
    }
}

/// The subject common names and the subject alternative names (DNS names,
/// e-mail addresses, URIs, IP addresses) of a DER certificate; none if it
/// does not parse.
fn cert_names(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                    names.push(s.to_string())
                }
                GeneralName::IPAddress(b) => names.extend(ip_name(b)),
                _ => {}
            }
        }
    }
    names
}

/// An IP address SAN as text.
fn ip_name(b: &[u8]) -> Option<String> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b)
            .ok()
            .map(|a| std::net::IpAddr::from(a).to_string()),
        16 => <[u8; 16]>::try_from(b)
            .ok()
            .map(|a| std::net::IpAddr::from(a).to_string()),
        _ => None,
    }
}

/// Whether `name` matches `pattern`, where `*` matches any run of
/// characters (none included) and everything else itself.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// A failed call: the state machine's answer (mapped to the dialect's wire
/// error), a status of the call's own (no leader in time, shutting down,
/// its deadline), or a step this node could not take as the leader, which
/// the router retries (see `super::router`).
#[derive(Clone, Debug)]
pub enum CallError {
    /// The state machine's answer.
    Domain(DomainError),
    /// The call could not be carried out.
    Status(Status),
    /// Not the leader here, or leadership moving: the router tries again.
    Retry(String),
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

impl From<super::Retry> for CallError {
    fn from(r: super::Retry) -> Self {
        CallError::Retry(r.0)
    }
}

/// The result of a call: one shape for every layer of the front door.
pub type CallResult<T> = Result<T, CallError>;

impl CallError {
    /// The wire status, domain errors encoded by `domain` (a retry that was
    /// not retried is UNAVAILABLE).
    pub fn into_status(self, domain: impl FnOnce(&DomainError) -> Status) -> Status {
        match self {
            CallError::Domain(d) => domain(&d),
            CallError::Status(s) => s,
            CallError::Retry(why) => Status::unavailable(why),
        }
    }

    /// The wire status, a domain error as its code and message.
    pub fn into_plain_status(self) -> Status {
        self.into_status(plain)
    }
}

/// A domain error as a status of its code and message (no payloads).
pub fn plain(e: &DomainError) -> Status {
    Status::new(tonic::Code::from_i32(e.code), e.message.clone())
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
mod tests;
