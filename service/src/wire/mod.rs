//! The wire: one module per dialect and per API of coordstore's own. A
//! handler translates one wire request into an area call (building the
//! journal command itself) and the answer back; what a whole dialect
//! shares — reading the call context, waiting until the service is
//! configured, a precondition such as xla's service-incarnation check, the
//! encoding of errors — is applied once, by [`serve`] and the service table
//! the [`dialect!`] macro writes. Adapters hold no state.
//!
//! | module | service | area |
//! |---|---|---|
//! | [`xla`] | `xla.coordination.CoordinationService` (stock jaxlib) | coordination |
//! | [`tf`] | `tensorflow.CoordinationService` (TensorFlow) | coordination |
//! | [`agent`] | `coordstore.v1.Agent` (the Rust agent) | coordination |
//! | [`tfdata`] | `tensorflow.data.DispatcherService` (tf.data) | dispatcher |
//! | [`closures`] | `coordstore.v1.ClosureQueue` | closures |
//! | [`rendezvous`] | `coordstore.v1.Rendezvous` (torchrun's `--rdzv-backend coordstore`) | rendezvous |
//! | [`node`] | `coordstore.v1.Node` (ctl, tools, other nodes) | core, coordination |
//! | [`torch`] | PyTorch's TCPStore protocol (raw TCP, same ports) | torch |

pub mod agent;
pub mod closures;
pub mod context;
pub mod listener;
pub mod namespaces;
pub mod node;
pub mod rendezvous;
pub mod tf;
pub mod tfdata;
pub mod torch;
pub mod xla;

use std::collections::HashMap;
use std::future::Future;

use journal::DomainError;
use prost::Message;
use proto::payloads::GrpcPayloadContainer;
use tonic::{Code, Request, Response, Status};

use crate::areas::coordination::Coordination;
use crate::core::{Access, Call, CallResult, Core};

/// The area the coordination dialects (xla, tf, agent) call.
pub(crate) type Area = Coordination;

/// A status with the `grpc-status-details-bin` trailer holding a serialized
/// `tensorflow.distributed_runtime.GrpcPayloadContainer` (none when
/// `payloads` is empty), as stock clients read it (`docs/protocols.md`,
/// Error payloads).
pub(crate) fn status_with_payloads(
    code: i32,
    message: &str,
    payloads: HashMap<String, Vec<u8>>,
) -> Status {
    let code = Code::from_i32(code);
    if payloads.is_empty() {
        return Status::new(code, message.to_string());
    }
    let container = GrpcPayloadContainer { payloads };
    Status::with_details(code, message.to_string(), container.encode_to_vec().into())
}

/// The arrival of `task` at a barrier call of either coordination dialect:
/// the request's (id, counter, timeout in ms), and its participants by
/// index with the first name that names no task (see [`participants`]).
pub(crate) fn arrival(
    task: u32,
    recoverable: bool,
    (id, counter, timeout_ms): (String, i64, i64),
    (participants, unknown_participant): (Vec<u32>, String),
) -> journal::pb::coordination::BarrierArrive {
    journal::pb::coordination::BarrierArrive {
        id,
        counter,
        timeout_ms: timeout_ms.max(0) as u64,
        participants,
        task,
        unknown_participant,
        recoverable,
    }
}

/// The tasks a barrier call names, by index, and how the first that names
/// no task is written (`""`: none): `index` resolves a name, `name` writes
/// one.
pub(crate) fn participants<T>(
    named: &[T],
    index: impl Fn(&T) -> CallResult<u32>,
    name: impl Fn(&T) -> String,
) -> (Vec<u32>, String) {
    let mut known = Vec::with_capacity(named.len());
    let mut unknown = String::new();
    for t in named {
        match index(t) {
            Ok(i) => known.push(i),
            Err(_) if unknown.is_empty() => unknown = name(t),
            Err(_) => {}
        }
    }
    (known, unknown)
}

/// The payloads of a domain error, both coordination dialects: the
/// CoordinationServiceError `coordination` encodes (when the error carries
/// one) and the BarrierError `barrier` encodes from (id, counter).
pub(crate) fn payloads(
    e: &DomainError,
    coordination: impl FnOnce() -> Vec<u8>,
    barrier: impl FnOnce(String, i64) -> Vec<u8>,
) -> HashMap<String, Vec<u8>> {
    let mut payloads = HashMap::new();
    if e.coordination_payload {
        let key = proto::payload_keys::COORDINATION_SERVICE_ERROR;
        payloads.insert(key.to_string(), coordination());
    }
    if let Some(b) = &e.barrier {
        let key = proto::payload_keys::BARRIER_ERROR;
        payloads.insert(key.to_string(), barrier(b.id.clone(), b.counter));
    }
    payloads
}

/// Where a call is admitted: what it needs ([`Access`]) and, for a call
/// that names its namespace in its message rather than in its metadata
/// (the Node API's namespace views), that namespace.
pub(crate) struct Door {
    access: Access<'static>,
    namespace: Option<String>,
}

impl Door {
    /// The call's own namespace, admitted for `access`.
    pub(crate) fn at(access: Access<'static>) -> Door {
        Door {
            access,
            namespace: None,
        }
    }

    /// Namespace `name` (named in the message), admitted for `access`.
    pub(crate) fn into_namespace(name: &str, access: Access<'static>) -> Door {
        Door {
            access,
            namespace: Some(name.to_string()),
        }
    }
}

/// The door of a service whose calls all need `access`, the message passed
/// on as it is.
pub(crate) fn door<Req>(
    access: Access<'static>,
) -> impl FnOnce(Req) -> Result<(Door, Req), Status> {
    move |r| Ok((Door::at(access), r))
}

/// Serves one call of any gRPC service of this node: the one pipeline
/// every call runs. The call's context is read from the request's metadata
/// (`context::call_of`; a malformed header is INVALID_ARGUMENT before
/// anything happens); `door` reads the message into what `body` takes and
/// says where the call is admitted; the call is admitted there
/// (`Core::admit`, the one rule); `body` runs it (the dialect's own
/// precondition, then the area); and a failure is encoded with the
/// dialect's `errors`.
pub(crate) async fn serve<Req, In, Resp, Fut>(
    core: &Core,
    req: Request<Req>,
    door: impl FnOnce(Req) -> Result<(Door, In), Status>,
    errors: impl Fn(&Call, &DomainError) -> Status,
    body: impl FnOnce(Call, In) -> Fut,
) -> Result<Response<Resp>, Status>
where
    Fut: Future<Output = (Call, CallResult<Resp>)>,
{
    let mut call = context::call_of(&req)?;
    let (door, input) = door(req.into_inner())?;
    if let Some(name) = &door.namespace {
        call = call.in_namespace(name);
    }
    if let Err(e) = core.admit(&call, door.access).await {
        return Err(e.into_status(|d| errors(&call, d)));
    }
    let (call, answer) = body(call, input).await;
    answer
        .map(Response::new)
        .map_err(|e| e.into_status(|d| errors(&call, d)))
}

/// Writes a coordination dialect's gRPC service: the service (a struct over
/// the [`Area`], and its tonic server with gzip accepted and the node's
/// message limits), then one row per method, each served by [`serve`] with
/// the dialect's error encoding and, where given, its precondition
/// (`admit`, checked before every handler), then the module's handler of
/// the same name: `async fn m(a: &Area, c: &Call, r: Req) -> CallResult<Resp>`.
/// A first row `kv;` adds the KV methods both dialects serve alike (see
/// [`kv_handlers`]). Methods of another shape (a stream) go into a last
/// `{ ... }`.
macro_rules! dialect {
    (
        $(#[$doc:meta])* $service:ident: $trait:ident in $server:ident, errors = $errors:path;
        $($rest:tt)*
    ) => {
        crate::wire::dialect! {
            $(#[$doc])* $service: $trait in $server, errors = $errors, admit = crate::wire::admit_any;
            $($rest)*
        }
    };
    (
        $(#[$doc:meta])* $service:ident: $trait:ident in $server:ident, errors = $errors:path, admit = $admit:path;
        kv;
        $($method:ident($req:ty) -> $resp:ty;)*
        $({ $($more:tt)* })?
    ) => {
        crate::wire::kv_handlers!();
        crate::wire::dialect! {
            $(#[$doc])* $service: $trait in $server, errors = $errors, admit = $admit;
            insert_key_value(InsertKeyValueRequest) -> InsertKeyValueResponse;
            get_key_value(GetKeyValueRequest) -> GetKeyValueResponse;
            try_get_key_value(TryGetKeyValueRequest) -> TryGetKeyValueResponse;
            get_key_value_dir(GetKeyValueDirRequest) -> GetKeyValueDirResponse;
            delete_key_value(DeleteKeyValueRequest) -> DeleteKeyValueResponse;
            $($method($req) -> $resp;)*
            $({ $($more)* })?
        }
    };
    (
        $(#[$doc:meta])* $service:ident: $trait:ident in $server:ident, errors = $errors:path, admit = $admit:path;
        $($method:ident($req:ty) -> $resp:ty;)*
        $({ $($more:tt)* })?
    ) => {
        $(#[$doc])*
        pub struct $service {
            area: crate::wire::Area,
        }

        impl $service {
            /// The tonic service: gzip accepted, message limits from the
            /// node config.
            pub fn server(area: crate::wire::Area, max_message_bytes: usize) -> $server<$service> {
                $server::new($service { area })
                    .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                    .max_decoding_message_size(max_message_bytes)
                    .max_encoding_message_size(max_message_bytes)
            }
        }

        #[tonic::async_trait]
        impl $trait for $service {
            $($($more)*)?
            $(
                async fn $method(
                    &self,
                    req: tonic::Request<$req>,
                ) -> Result<tonic::Response<$resp>, tonic::Status> {
                    let a = &self.area;
                    let errors = |c: &crate::core::Call, d: &journal::DomainError| $errors(a, c, d);
                    let configured = crate::wire::door(crate::core::Access::Configured);
                    crate::wire::serve(a.core(), req, configured, errors, |c, r| async move {
                        let answer = async {
                            $admit(a, &c, &r).await?;
                            $method(a, &c, r).await
                        }
                        .await;
                        (c, answer)
                    })
                    .await
                }
            )*
        }
    };
}
pub(crate) use dialect;

/// The precondition of a dialect that has none.
pub(crate) async fn admit_any<R>(_: &Area, _: &Call, _: &R) -> CallResult<()> {
    Ok(())
}

/// The KV handlers, the same in both coordination dialects (their messages
/// share names and shapes): written once, expanded in each dialect's module
/// over its own message types.
macro_rules! kv_handlers {
    () => {
        async fn insert_key_value(
            a: &Area,
            c: &Call,
            r: InsertKeyValueRequest,
        ) -> CallResult<InsertKeyValueResponse> {
            let kv = r.kv.unwrap_or_default();
            let insert = journal::pb::coordination::KvInsert {
                key: kv.key,
                value: kv.value,
                allow_overwrite: r.allow_overwrite,
            };
            a.apply(c, insert).await?;
            Ok(InsertKeyValueResponse {})
        }

        async fn get_key_value(
            a: &Area,
            c: &Call,
            r: GetKeyValueRequest,
        ) -> CallResult<GetKeyValueResponse> {
            let value = a.kv_get(c, &r.key).await?;
            let kv = Some(KeyValueEntry { key: r.key, value });
            Ok(GetKeyValueResponse { kv })
        }

        async fn try_get_key_value(
            a: &Area,
            c: &Call,
            r: TryGetKeyValueRequest,
        ) -> CallResult<TryGetKeyValueResponse> {
            let value = a.kv_try_get(c, &r.key).await?;
            let kv = Some(KeyValueEntry { key: r.key, value });
            Ok(TryGetKeyValueResponse { kv })
        }

        async fn get_key_value_dir(
            a: &Area,
            c: &Call,
            r: GetKeyValueDirRequest,
        ) -> CallResult<GetKeyValueDirResponse> {
            let entries = a.kv_dir(c, &r.directory_key).await?;
            let kv = entries
                .into_iter()
                .map(|(key, value)| KeyValueEntry { key, value });
            let (directory_key, kv) = (r.directory_key, kv.collect());
            Ok(GetKeyValueDirResponse { directory_key, kv })
        }

        async fn delete_key_value(
            a: &Area,
            c: &Call,
            r: DeleteKeyValueRequest,
        ) -> CallResult<DeleteKeyValueResponse> {
            a.apply(c, journal::pb::coordination::KvDelete { key: r.key })
                .await?;
            Ok(DeleteKeyValueResponse {})
        }
    };
}
pub(crate) use kv_handlers;
