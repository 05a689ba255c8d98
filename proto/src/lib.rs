//! The wire protocols coordstore speaks, generated at build time.
//!
//! * [`xla`] — `xla.coordination.CoordinationService`, the API stock jaxlib
//!   0.12 dials (`proto/xla_coordination.proto`; `docs/protocols.md`,
//!   xla.coordination (jaxlib 0.12)).
//! * [`tf`] — `tensorflow.CoordinationService`, the TensorFlow-era API (the
//!   seed protocol of `docs/protocols.md`), with device-info messages
//!   carried as opaque bytes.
//! * [`tfdata`] — `tensorflow.data.DispatcherService`, the tf.data service
//!   dispatcher TensorFlow 2.21 workers and clients dial.
//! * [`coordstore`] — coordstore's own API: Raft peer RPCs and the node API.
//! * [`payloads`] — `tensorflow.distributed_runtime.GrpcPayloadContainer`, the
//!   container both dialects put in the `grpc-status-details-bin` trailer.
//! * [`torch`] — PyTorch's TCPStore protocol (raw TCP, no protobuf): its
//!   decoder and encoder.
//!
//! Server and client stubs are generated for each service; the service crate
//! and the agent share them.

pub mod tls;
pub mod torch;

/// `xla.coordination`: messages and the `CoordinationService` stubs jaxlib 0.12 uses.
#[allow(clippy::all, clippy::pedantic)]
pub mod xla {
    tonic::include_proto!("xla.coordination");
}

/// `tensorflow`: the TensorFlow-dialect coordination messages and stubs.
#[allow(clippy::all, clippy::pedantic)]
pub mod tf {
    tonic::include_proto!("tensorflow");
}

/// `tensorflow.data`: the tf.data service dispatcher API of TensorFlow 2.21,
/// with TensorFlow's graph and tensor messages as opaque bytes.
#[allow(clippy::all, clippy::pedantic)]
pub mod tfdata {
    tonic::include_proto!("tensorflow.data");
}

/// The TensorFlow graph messages coordstore decodes from a dataset
/// definition (DYNAMIC sharding's source), TensorFlow's field numbers.
#[allow(clippy::all, clippy::pedantic)]
pub mod tfgraph {
    tonic::include_proto!("coordstore.tfgraph");
}

/// `coordstore.v1`: coordstore's own API — Raft peer RPCs and the node API.
#[allow(clippy::all, clippy::pedantic)]
pub mod coordstore {
    tonic::include_proto!("coordstore.v1");
}

/// `tensorflow.distributed_runtime`: the error-payload container.
#[allow(clippy::all, clippy::pedantic)]
pub mod payloads {
    tonic::include_proto!("tensorflow.distributed_runtime");
}

pub mod origin;

/// gRPC metadata key that gives a coordination call's update its
/// exactly-once origin, `CLIENT_ID:SEQ[:DONE_BELOW]` in decimal (see
/// [`origin`]). The relay and the agent set it; a node that receives a
/// retried call with the same origin (at any node) returns the first outcome
/// instead of applying the call twice.
pub const ORIGIN_HEADER: &str = "x-coordstore-origin";

/// gRPC metadata key naming the namespace a call acts in, for coordstore's
/// own clients on a node's main port (stock clients pick their namespace by
/// its port). Without it a call acts in the default namespace.
pub const NAMESPACE_HEADER: &str = "x-coordstore-namespace";

/// Map keys of [`payloads::GrpcPayloadContainer::payloads`] as stock clients read them.
/// The values are serialized messages of the dialect's own package despite the
/// `tensorflow.` in the key.
pub mod payload_keys {
    /// Key of the serialized `CoordinationServiceError`.
    pub const COORDINATION_SERVICE_ERROR: &str =
        "type.googleapis.com/tensorflow.CoordinationServiceError";
    /// Key of the serialized `BarrierError`.
    pub const BARRIER_ERROR: &str = "type.googleapis.com/tensorflow.BarrierError";
    /// Key of the serialized `ServiceMismatchError`.
    pub const SERVICE_MISMATCH_ERROR: &str = "type.googleapis.com/tensorflow.ServiceMismatchError";
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn xla_field_numbers_match_the_reference() {
        // BarrierRequest.counter is field 6 (varint): tag = 6 << 3 | 0 = 0x30.
        let req = xla::BarrierRequest {
            counter: 1,
            ..Default::default()
        };
        assert_eq!(req.encode_to_vec(), vec![0x30, 0x01]);
        // RegisterTaskRequest.incarnation is fixed64 field 3: tag 0x19.
        let req = xla::RegisterTaskRequest {
            incarnation: 7,
            source_task_id: 0,
        };
        assert_eq!(req.encode_to_vec()[0], 0x19);
    }

    #[test]
    fn tf_device_list_is_wire_compatible_with_repeated_messages() {
        // A repeated bytes field and a repeated message field share wire type 2.
        let list = tf::TfDeviceList {
            devices: vec![vec![0x0a, 0x01, b'x']],
        };
        assert_eq!(list.encode_to_vec(), vec![0x0a, 0x03, 0x0a, 0x01, b'x']);
    }
}
