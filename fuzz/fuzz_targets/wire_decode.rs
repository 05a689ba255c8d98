//! Every gRPC request decoder of both dialects and coordstore's own API:
//! arbitrary bytes never panic the decoders.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    macro_rules! try_decode {
        ($($t:ty),*) => {{
            let decoders: &[fn(&[u8])] = &[$(|b| { let _ = <$t>::decode(b); }),*];
            decoders[which as usize % decoders.len()](body);
        }};
    }
    use proto::{coordstore as cs, tf, xla};
    try_decode!(
        xla::RegisterTaskRequest, xla::HeartbeatRequest, xla::ShutdownTaskRequest,
        xla::WatchTasksRequest, xla::InsertKeyValueRequest, xla::GetKeyValueRequest,
        xla::TryGetKeyValueRequest, xla::IncrementKeyValueRequest, xla::GetKeyValueDirRequest,
        xla::DeleteKeyValueRequest, xla::BarrierRequest, xla::CancelBarrierRequest,
        xla::GetAliveTasksRequest, xla::PollForErrorRequest, xla::ReportErrorToServiceRequest,
        tf::RegisterTaskRequest, tf::HeartbeatRequest, tf::WaitForAllTasksRequest,
        tf::ShutdownTaskRequest, tf::ResetTaskRequest, tf::ReportErrorToServiceRequest,
        tf::InsertKeyValueRequest, tf::GetKeyValueRequest, tf::TryGetKeyValueRequest,
        tf::GetKeyValueDirRequest, tf::DeleteKeyValueRequest, tf::BarrierRequest,
        tf::CancelBarrierRequest, cs::ProposeRequest, cs::KvGetRequest, cs::KvListRequest,
        cs::WatchRequest, cs::PutKeyValueRequest, cs::AddMemberRequest,
        proto::payloads::GrpcPayloadContainer
    );
});
