//! `tensorflow.data.DispatcherService`, the tf.data service dispatcher as
//! TensorFlow 2.21 workers and clients dial it (reference
//! tf-data-dispatcher.md §3, §7). GetVersion and GetDataServiceConfig are
//! answered by any node; every other call runs on the leader, and a
//! follower forwards the whole call there. While no leader is known a call
//! gets UNAVAILABLE (which TF retries), never NOT_FOUND or
//! FAILED_PRECONDITION (which end an input pipeline), and a forward to a
//! leader that hangs ends as UNAVAILABLE, never as DEADLINE_EXCEEDED.
//! Distributed snapshots are UNIMPLEMENTED.

use std::future::Future;
use std::sync::Arc;

use journal::pb::Origin;
use journal::Update;
use proto::tfdata::dispatcher_service_client::DispatcherServiceClient;
use proto::tfdata::dispatcher_service_server::{DispatcherService, DispatcherServiceServer};
use proto::tfdata::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::dispatcher::{Dispatcher, OnLeader};
use crate::router::{forwarded, was_forwarded};

/// The tf.data dispatcher service of a node.
#[derive(Clone)]
pub struct TfDataService {
    d: Arc<Dispatcher>,
}

impl TfDataService {
    /// The tonic service.
    pub fn server(d: Arc<Dispatcher>, max_message_bytes: usize) -> DispatcherServiceServer<Self> {
        DispatcherServiceServer::new(TfDataService { d })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// Runs `local` on the leader (with an origin drawn once for the call
    /// when `exactly_once`), or `remote` at the leader from a follower.
    async fn on_leader<Req, Resp, L, LF, R, RF>(
        &self,
        req: Request<Req>,
        exactly_once: bool,
        local: L,
        remote: R,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Clone,
        L: Fn(Arc<Dispatcher>, Option<Origin>, Req) -> LF,
        LF: Future<Output = OnLeader<Resp>>,
        R: Fn(DispatcherServiceClient<Channel>, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<Resp>, Status>>,
    {
        let may_forward = !was_forwarded(&req);
        // The call's origin: the caller's (a relay's) when it sends one,
        // else one drawn here once; a forward carries it to the leader, so
        // the call is exactly-once across every retry.
        let sent = crate::coordination::request_origin(&req)?;
        let r = req.into_inner();
        let router = self.d.router().clone();
        let mut probe = Update {
            origin: sent,
            ..Default::default()
        };
        let _lane = if exactly_once {
            router.stamp_origin(&mut probe)
        } else {
            None
        };
        let origin = probe.origin.filter(|_| exactly_once);
        let header = origin.map(|o| {
            proto::origin::WireOrigin {
                client_id: o.client_id,
                seq: o.seq,
                done_below: o.done_below,
            }
            .header_value()
        });
        let max = router.max_message_bytes();
        let started = std::time::Instant::now();
        let answer = router
            .on_leader_via(
                may_forward,
                || local(self.d.clone(), origin, r.clone()),
                |ch| {
                    let client = DispatcherServiceClient::new(ch)
                        .max_decoding_message_size(max)
                        .max_encoding_message_size(max);
                    let mut req = forwarded(r.clone());
                    if let Some(h) = header.as_deref().and_then(|h| h.parse().ok()) {
                        req.metadata_mut().insert(proto::ORIGIN_HEADER, h);
                    }
                    let call = remote(client, req);
                    async move { call.await.map(|resp| Ok(resp.into_inner())) }
                },
            )
            .await;
        let answer = answer.and_then(|a| a);
        tracing::debug!(
            call = std::any::type_name::<Req>().rsplit("::").next().unwrap_or_default(),
            forwarded = !may_forward,
            ms = started.elapsed().as_secs_f64() * 1000.0,
            code = ?answer.as_ref().err().map(|s| s.code()),
            "tf.data call"
        );
        answer.map(Response::new)
    }
}

fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!(
        "coordstore's tf.data dispatcher does not serve {what} (distributed snapshots are not supported yet)"
    ))
}

#[tonic::async_trait]
impl DispatcherService for TfDataService {
    async fn worker_heartbeat(
        &self,
        req: Request<WorkerHeartbeatRequest>,
    ) -> Result<Response<WorkerHeartbeatResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.worker_heartbeat(o, r).await },
            |mut c, r| async move { c.worker_heartbeat(r).await },
        )
        .await
    }

    async fn worker_update(
        &self,
        req: Request<WorkerUpdateRequest>,
    ) -> Result<Response<WorkerUpdateResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.worker_update(o, r).await },
            |mut c, r| async move { c.worker_update(r).await },
        )
        .await
    }

    async fn get_dataset_def(
        &self,
        req: Request<GetDatasetDefRequest>,
    ) -> Result<Response<GetDatasetDefResponse>, Status> {
        self.on_leader(
            req,
            false,
            |d, _, r| async move { d.get_dataset_def(r).await },
            |mut c, r| async move { c.get_dataset_def(r).await },
        )
        .await
    }

    async fn get_split(
        &self,
        req: Request<GetSplitRequest>,
    ) -> Result<Response<GetSplitResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.get_split(o, r).await },
            |mut c, r| async move { c.get_split(r).await },
        )
        .await
    }

    async fn get_version(
        &self,
        _req: Request<GetVersionRequest>,
    ) -> Result<Response<GetVersionResponse>, Status> {
        Ok(Response::new(GetVersionResponse {
            version: self.d.version(),
        }))
    }

    async fn get_or_register_dataset(
        &self,
        req: Request<GetOrRegisterDatasetRequest>,
    ) -> Result<Response<GetOrRegisterDatasetResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.get_or_register_dataset(o, r).await },
            |mut c, r| async move { c.get_or_register_dataset(r).await },
        )
        .await
    }

    async fn get_or_create_job(
        &self,
        req: Request<GetOrCreateJobRequest>,
    ) -> Result<Response<GetOrCreateJobResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.get_or_create_job(o, r).await },
            |mut c, r| async move { c.get_or_create_job(r).await },
        )
        .await
    }

    async fn get_or_create_iteration(
        &self,
        req: Request<GetOrCreateIterationRequest>,
    ) -> Result<Response<GetOrCreateIterationResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.get_or_create_iteration(o, r).await },
            |mut c, r| async move { c.get_or_create_iteration(r).await },
        )
        .await
    }

    async fn maybe_remove_task(
        &self,
        req: Request<MaybeRemoveTaskRequest>,
    ) -> Result<Response<MaybeRemoveTaskResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.maybe_remove_task(o, r).await },
            |mut c, r| async move { c.maybe_remove_task(r).await },
        )
        .await
    }

    async fn release_iteration_client(
        &self,
        req: Request<ReleaseIterationClientRequest>,
    ) -> Result<Response<ReleaseIterationClientResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.release_iteration_client(o, r).await },
            |mut c, r| async move { c.release_iteration_client(r).await },
        )
        .await
    }

    async fn client_heartbeat(
        &self,
        req: Request<ClientHeartbeatRequest>,
    ) -> Result<Response<ClientHeartbeatResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.client_heartbeat(o, r).await },
            |mut c, r| async move { c.client_heartbeat(r).await },
        )
        .await
    }

    async fn get_workers(
        &self,
        req: Request<GetWorkersRequest>,
    ) -> Result<Response<GetWorkersResponse>, Status> {
        self.on_leader(
            req,
            false,
            |d, _, _| async move { Ok(Ok(d.get_workers())) },
            |mut c, r| async move { c.get_workers(r).await },
        )
        .await
    }

    async fn get_data_service_metadata(
        &self,
        req: Request<GetDataServiceMetadataRequest>,
    ) -> Result<Response<GetDataServiceMetadataResponse>, Status> {
        self.on_leader(
            req,
            false,
            |d, _, r| async move { d.get_data_service_metadata(r).await },
            |mut c, r| async move { c.get_data_service_metadata(r).await },
        )
        .await
    }

    async fn get_data_service_config(
        &self,
        _req: Request<GetDataServiceConfigRequest>,
    ) -> Result<Response<GetDataServiceConfigResponse>, Status> {
        Ok(Response::new(GetDataServiceConfigResponse {
            config: Some(DataServiceConfig { deployment_mode: 0 }),
        }))
    }

    async fn snapshot(
        &self,
        _req: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotResponse>, Status> {
        Err(unimplemented("Snapshot"))
    }

    async fn get_snapshot_split(
        &self,
        _req: Request<GetSnapshotSplitRequest>,
    ) -> Result<Response<GetSnapshotSplitResponse>, Status> {
        Err(unimplemented("GetSnapshotSplit"))
    }

    async fn get_snapshot_streams(
        &self,
        _req: Request<GetSnapshotStreamsRequest>,
    ) -> Result<Response<GetSnapshotStreamsResponse>, Status> {
        Err(unimplemented("GetSnapshotStreams"))
    }

    async fn disable_compression_at_runtime(
        &self,
        req: Request<DisableCompressionAtRuntimeRequest>,
    ) -> Result<Response<DisableCompressionAtRuntimeResponse>, Status> {
        self.on_leader(
            req,
            true,
            |d, o, r| async move { d.disable_compression(o, r).await },
            |mut c, r| async move { c.disable_compression_at_runtime(r).await },
        )
        .await
    }
}
