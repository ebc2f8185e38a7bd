//! [`Cloud`] over `google-cloud-compute-v1`: Compute Engine VMs and their
//! Persistent Disks, in the same plain facts as EC2's.

use std::time::Duration;

use async_trait::async_trait;
use futures::future::try_join_all;
use google_cloud_compute_v1::client::{Disks, Instances, RegionDisks, ZoneOperations};
use google_cloud_compute_v1::model::{AttachedDisk, Instance, Operation, TestPermissionsRequest};
use google_cloud_gax::error::rpc::{Code, StatusDetails};
use google_cloud_gax::exponential_backoff::{ExponentialBackoff, ExponentialBackoffBuilder};
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicy as GaxRetryPolicy, RetryPolicyExt};
use google_cloud_gax::retry_throttler::CircuitBreaker;

use super::{Cloud, CloudCall, CloudError, Detach, PowerOff, PowerOffAnswer};
use crate::core::model::facts::{
    InstanceFacts, MachineIdentity, StatusChecks, VolumeAttachmentState, VolumeFacts,
};
use crate::core::model::gce::{self, DiskLocation, GceInstance, GceStatus, PdDisk, StopStep};
use crate::core::model::instance::{
    AttachmentState, InstanceId, InstanceState, Provider, VolumeId, VolumeState,
};
use crate::core::model::values;
use crate::core::rules::retry::{self, RetryPolicy};
use crate::core::rules::silence;
use crate::shell::timeouts::Timeouts;

/// How long one detach may take, its operation waited on, before it counts
/// as failed (and is retried). A detach from a stopped VM completes in
/// seconds.
const DETACH_WAIT: Duration = Duration::from_secs(60);

/// The first pause before a detach's operation is asked about again, and
/// the longest: most finish within a second or two, so the first looks
/// come soon and the later ones rarely.
const POLL_FIRST: Duration = Duration::from_millis(200);
const POLL_MAX: Duration = Duration::from_secs(2);

/// Retries refused across all calls of one client once this many retries
/// failed with nothing succeeding in between (each failure costs
/// [`RETRY_COST`] tokens, each success returns one), as the AWS SDK's
/// standard retry quota does. The client library's default throttler
/// instead refuses a retry at random from the first failure of a new
/// client: half the time, right after a cold start.
const RETRY_TOKENS: u64 = 500;
const RETRY_COST: u64 = 5;

/// [`Cloud`] over the Compute Engine API.
#[derive(Clone, Debug)]
pub struct Gce {
    instances: Instances,
    disks: Disks,
    region_disks: RegionDisks,
    operations: ZoneOperations,
}

/// Where and how to reach Compute Engine.
#[derive(Clone, Debug)]
pub struct GceEndpoint {
    /// Another base URL than `https://compute.googleapis.com` (a Private
    /// Service Connect endpoint, or a local stand-in). A plain `http://`
    /// one is only ever local: no credentials are sent to it.
    pub url: Option<String>,
    /// How long one attempt may take (connection included) and one call,
    /// its retries included; the connect timeout is not used, the attempt
    /// timeout covers it.
    pub timeouts: Timeouts,
}

impl Default for GceEndpoint {
    fn default() -> Self {
        Self {
            url: None,
            timeouts: Timeouts {
                call: retry::COMPUTE.budget,
                ..Timeouts::default()
            },
        }
    }
}

/// What the clients retry, within `policy`'s attempts and `call`: a 429
/// (not retried by the library's strict reading of AIP-194) always, since
/// nothing was done; and for idempotent calls only, a 503, a dropped
/// connection and an attempt that timed out. Reads are idempotent, and so
/// is a detach, by its request id. A connection never made is always
/// retried.
fn retry_policy(policy: &RetryPolicy, call: Duration) -> impl GaxRetryPolicy + 'static {
    Aip194Strict
        .continue_on_client_timeout()
        .continue_on_too_many_requests()
        .with_attempt_limit(policy.max_attempts)
        .with_time_limit(call)
}

/// Pauses that double from `policy.base` up to `policy.cap`, each a random
/// share of that ceiling.
fn backoff(policy: &RetryPolicy) -> Result<ExponentialBackoff, String> {
    ExponentialBackoffBuilder::new()
        .with_initial_delay(policy.base)
        .with_maximum_delay(policy.cap)
        .with_scaling(2.0)
        .build()
        .map_err(|e| format!("the Compute Engine backoff: {e}"))
}

/// The pause before the operation is asked about again, after `polls`
/// looks at it.
fn poll_pause(polls: u32) -> Duration {
    POLL_FIRST
        .checked_mul(1u32.checked_shl(polls).unwrap_or(u32::MAX))
        .map_or(POLL_MAX, |d| d.min(POLL_MAX))
}

impl Gce {
    /// Builds the clients with Application Default Credentials (on Cloud
    /// Run, the service's identity from the metadata server); makes no call.
    pub async fn new(endpoint: &GceEndpoint) -> Result<Self, String> {
        let anonymous = endpoint
            .url
            .as_deref()
            .is_some_and(|u| u.starts_with("http://"));
        macro_rules! client {
            ($client:ty) => {{
                let mut builder = <$client>::builder();
                if let Some(url) = &endpoint.url {
                    builder = builder.with_endpoint(url.trim_end_matches('/'));
                }
                if anonymous {
                    builder = builder.with_credentials(
                        google_cloud_auth::credentials::anonymous::Builder::new().build(),
                    );
                }
                builder
                    .with_retry_policy(retry_policy(&retry::COMPUTE, endpoint.timeouts.call))
                    .with_backoff_policy(backoff(&retry::COMPUTE)?)
                    .with_retry_throttler(CircuitBreaker::clamp(RETRY_TOKENS, 0, RETRY_COST))
                    .with_attempt_timeout(endpoint.timeouts.attempt)
                    .build()
                    .await
                    .map_err(|e| format!("building the Compute Engine client: {e}"))?
            }};
        }
        Ok(Self {
            instances: client!(Instances),
            disks: client!(Disks),
            region_disks: client!(RegionDisks),
            operations: client!(ZoneOperations),
        })
    }

    /// The device name `vm` gives the disk `pd`, and the VM's id, read
    /// right before the detach: the last look at the machine itself.
    /// Compute Engine restarts a VM on its own after a host error: anything
    /// but the VM the fencing judged, off, holds the detach back.
    async fn device_to_detach(
        &self,
        volume: &VolumeId,
        vm: &GceInstance,
        pd: &PdDisk,
        order: &Detach<'_>,
    ) -> Result<(Option<u64>, String), CloudError> {
        let fail = |code: Option<&str>, message: String| detach_failed(volume, code, message);
        let found = self
            .get(vm)
            .await
            .map_err(|e| fail(None, format!("instances.get {vm}: {e}")))?;
        let Some(found) = found else {
            return Err(fail(Some("NotAttached"), format!("{vm} no longer exists")));
        };
        let status = status_of(&found);
        gce::may_detach(order.machine.identity.uid, status, found.id)
            .map_err(|held| fail(Some("MachineNotOff"), format!("{vm}: {held}")))?;
        let Some(attached) = attached(&found, pd, vm.project()) else {
            return Err(fail(Some("NotAttached"), format!("{vm} does not hold it")));
        };
        if attached.boot == Some(true) {
            return Err(fail(
                Some("BootDisk"),
                format!("it is the boot disk of {vm}: never detached"),
            ));
        }
        let device = attached
            .device_name
            .clone()
            .ok_or_else(|| fail(None, format!("{vm} reports no device name for it")))?;
        Ok((found.id, device))
    }

    /// Whether `vm`, read again, still holds the disk `pd`: `None` when it
    /// cannot be read; a VM that is gone holds none.
    async fn holds(&self, vm: &GceInstance, pd: &PdDisk) -> Option<bool> {
        let found = self.get(vm).await.ok()?;
        Some(found.is_some_and(|found| attached(&found, pd, vm.project()).is_some()))
    }

    async fn get(
        &self,
        vm: &GceInstance,
    ) -> Result<Option<Instance>, google_cloud_compute_v1::Error> {
        let got = self
            .instances
            .get()
            .set_project(vm.project())
            .set_zone(vm.zone())
            .set_instance(vm.name())
            .send()
            .await;
        match got {
            Ok(instance) => Ok(Some(instance)),
            Err(e) if is_not_found(&e, &vm.to_string()) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The permissions among `wanted` this identity holds on `vm`, as
    /// `instances.testIamPermissions` answers (asking needs no permission).
    pub async fn granted_on_vm(
        &self,
        vm: &GceInstance,
        wanted: &[&str],
    ) -> Result<Vec<String>, String> {
        self.instances
            .test_iam_permissions()
            .set_project(vm.project())
            .set_zone(vm.zone())
            .set_resource(vm.name())
            .set_body(TestPermissionsRequest::new().set_permissions(wanted.iter().copied()))
            .send()
            .await
            .map(|answer| answer.permissions)
            .map_err(|e| e.to_string())
    }

    /// The boot disk of `vm`, a disk of the cluster's project to test disk
    /// permissions on; `None` when the VM or its boot disk is not found.
    pub async fn boot_disk(&self, vm: &GceInstance) -> Result<Option<PdDisk>, String> {
        let found = self.get(vm).await.map_err(|e| e.to_string())?;
        Ok(found
            .and_then(|i| i.disks.into_iter().find(|d| d.boot == Some(true)))
            .and_then(|d| d.source)
            .and_then(|link| {
                let path = link
                    .split_once("/compute/v1/")
                    .map_or(link.as_str(), |(_, p)| p);
                PdDisk::from_handle(path)
            }))
    }

    /// The permissions among `wanted` this identity holds on `disk`.
    pub async fn granted_on_disk(
        &self,
        disk: &PdDisk,
        wanted: &[&str],
    ) -> Result<Vec<String>, String> {
        let Some(project) = disk.project.as_deref() else {
            return Err(format!("disk {} names no project", disk.name));
        };
        let body = TestPermissionsRequest::new().set_permissions(wanted.iter().copied());
        let answer = match &disk.location {
            DiskLocation::Zone(zone) => {
                self.disks
                    .test_iam_permissions()
                    .set_project(project)
                    .set_zone(zone)
                    .set_resource(&disk.name)
                    .set_body(body)
                    .send()
                    .await
            }
            DiskLocation::Region(region) => {
                self.region_disks
                    .test_iam_permissions()
                    .set_project(project)
                    .set_region(region)
                    .set_resource(&disk.name)
                    .set_body(body)
                    .send()
                    .await
            }
        };
        answer
            .map(|answer| answer.permissions)
            .map_err(|e| e.to_string())
    }

    /// The disk as Compute Engine describes it, with the VMs using it;
    /// `None` when it does not exist.
    async fn disk(
        &self,
        id: &VolumeId,
        pd: &PdDisk,
    ) -> Result<Option<VolumeFacts>, google_cloud_compute_v1::Error> {
        // An UNSPECIFIED project is resolved against the machine before
        // the disk is looked up (`VolumeId::on_machine`); one left here
        // names no disk that can be asked about.
        let Some(project) = pd.project.as_deref() else {
            return Ok(None);
        };
        let path = match &pd.location {
            DiskLocation::Zone(zone) => {
                format!("projects/{project}/zones/{zone}/disks/{}", pd.name)
            }
            DiskLocation::Region(region) => {
                format!("projects/{project}/regions/{region}/disks/{}", pd.name)
            }
        };
        let got = match &pd.location {
            DiskLocation::Zone(zone) => self
                .disks
                .get()
                .set_project(project)
                .set_zone(zone)
                .set_disk(&pd.name)
                .send()
                .await
                .map(|d| (d.status.and_then(|s| s.name().map(str::to_owned)), d.users)),
            DiskLocation::Region(region) => self
                .region_disks
                .get()
                .set_project(project)
                .set_region(region)
                .set_disk(&pd.name)
                .send()
                .await
                .map(|d| (d.status.and_then(|s| s.name().map(str::to_owned)), d.users)),
        };
        let (status, users) = match got {
            Ok(found) => found,
            Err(e) if is_not_found(&e, &path) => return Ok(None),
            Err(e) => return Err(e),
        };
        let attachments: Vec<VolumeAttachmentState> = users
            .iter()
            .filter_map(|u| GceInstance::from_resource_name(u))
            .map(|vm| VolumeAttachmentState {
                instance: InstanceId::gce(&vm),
                device: None,
                state: AttachmentState::Attached,
            })
            .collect();
        let state = match status.as_deref() {
            Some("READY") if attachments.is_empty() => VolumeState::Available,
            Some("READY") => VolumeState::InUse,
            Some("CREATING" | "RESTORING") => VolumeState::Creating,
            Some("DELETING") => VolumeState::Deleting,
            Some("FAILED") => VolumeState::Error,
            _ => VolumeState::Unknown,
        };
        Ok(Some(VolumeFacts {
            id: id.clone(),
            state,
            attachments,
        }))
    }

    /// Waits, until `deadline`, for a zonal operation to finish; its
    /// error, if it ends with one, is the call's. It is asked about with
    /// `get`, an idempotent read each bounded by the client's policy,
    /// rather than `wait`, which Compute Engine may hold for two minutes,
    /// past any attempt timeout.
    async fn wait(
        &self,
        vm: &GceInstance,
        op: Operation,
        deadline: tokio::time::Instant,
    ) -> Result<(), Followed> {
        let Some(name) = op.name.clone() else {
            return Err(Followed::Failed("the operation has no name".into()));
        };
        let bound = deadline.saturating_duration_since(tokio::time::Instant::now());
        let late = || {
            Followed::Late(format!(
                "operation {name} not done after {} s",
                bound.as_secs()
            ))
        };
        let mut current = op;
        let mut polls = 0;
        while !is_done(&current) {
            let pause = poll_pause(polls);
            polls += 1;
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(late());
            }
            tokio::time::sleep(pause).await;
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            current = tokio::time::timeout(
                remaining,
                self.operations
                    .get()
                    .set_project(vm.project())
                    .set_zone(vm.zone())
                    .set_operation(&name)
                    .send(),
            )
            .await
            .map_err(|_| late())?
            .map_err(|e| Followed::Failed(format!("zoneOperations.get {name}: {e}")))?;
        }
        current
            .to_result()
            .map(|_| ())
            .map_err(|e| Followed::Failed(e.to_string()))
    }
}

/// How following an operation ended short of success.
#[derive(Debug)]
enum Followed {
    /// Still under way at the deadline: it may yet succeed.
    Late(String),
    /// It failed, or could not be asked about.
    Failed(String),
}

impl std::fmt::Display for Followed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Late(m) | Self::Failed(m) => f.write_str(m),
        }
    }
}

/// Whether `e` is Compute Engine's own word that `resource` (its path,
/// `projects/P/zones/Z/instances/N`) does not exist: a 404 whose body is
/// Google's JSON error with the reason `notFound` and a message naming
/// that very resource ("The resource 'projects/…' was not found"). Any
/// other 404 is a failed lookup, never "deleted": a proxy's or a load
/// balancer's bare or HTML answer, a wrong `COMPUTE_ENDPOINT` path
/// (Google's front end names no resource), or another project or zone
/// (the message names the project, or the reason is `invalid`).
fn is_not_found(e: &google_cloud_compute_v1::Error, resource: &str) -> bool {
    let Some(status) = e.status().filter(|_| e.http_status_code() == Some(404)) else {
        return false;
    };
    // Compute Engine leaves the body's `status` out (then `Unknown`); one
    // it sends must say the same.
    let code = matches!(status.code, Code::NotFound | Code::Unknown);
    code && has_reason(status, "notFound") && status.message.contains(&format!("'{resource}'"))
}

/// Whether `e` is Compute Engine's 400 `resourceNotReady`: an operation
/// on the resource (here another detach of the disk) is still running.
fn is_not_ready(e: &google_cloud_compute_v1::Error) -> bool {
    e.http_status_code() == Some(400)
        && e.status()
            .is_some_and(|status| has_reason(status, "resourceNotReady"))
}

/// Whether Google's error names `reason` (its `errors[].reason`, which the
/// client reads into an `ErrorInfo`).
fn has_reason(status: &google_cloud_gax::error::rpc::Status, reason: &str) -> bool {
    status
        .details
        .iter()
        .any(|d| matches!(d, StatusDetails::ErrorInfo(info) if info.reason == reason))
}

fn is_done(op: &Operation) -> bool {
    op.status
        .as_ref()
        .and_then(|s| s.name())
        .is_some_and(|s| s == "DONE")
}

/// Compute Engine's answer for a VM in plain facts. A VM Compute Engine
/// itself says it does not have ([`is_not_found`]) is deleted: off, with
/// nothing attached.
fn instance_facts(id: &InstanceId, found: Option<Instance>) -> InstanceFacts {
    let Some(vm) = found else {
        return InstanceFacts {
            id: id.clone(),
            state: InstanceState::Terminated,
            private_dns_name: None,
            vpc_id: None,
            private_ips: vec![],
            tags: vec![],
            root_device_name: None,
            root_volume: None,
            identity: MachineIdentity::default(),
            stopped_at: None,
            started_at: None,
        };
    };
    let status = status_of(&vm);
    let boot = vm.disks.iter().find(|d| d.boot == Some(true));
    InstanceFacts {
        id: id.clone(),
        state: InstanceState::from_gce(status),
        private_dns_name: None,
        vpc_id: None,
        private_ips: vm
            .network_interfaces
            .iter()
            .filter_map(|n| n.network_ip.as_deref()?.parse().ok())
            .collect(),
        tags: vm
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        root_device_name: boot.and_then(|d| d.device_name.clone()),
        root_volume: boot
            .and_then(|d| d.source.as_deref())
            .and_then(VolumeId::from_pd_source),
        identity: MachineIdentity {
            uid: vm.id,
            created_at: vm
                .creation_timestamp
                .as_deref()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(|t| t.as_second()),
            ..MachineIdentity::default()
        },
        stopped_at: vm
            .last_stop_timestamp
            .as_deref()
            .and_then(silence::gce_stop_time),
        started_at: vm
            .last_start_timestamp
            .as_deref()
            .and_then(values::unix_seconds),
    }
}

/// The disk entry of `found` (a VM of `project`) that is `pd`.
fn attached<'a>(found: &'a Instance, pd: &PdDisk, project: &str) -> Option<&'a AttachedDisk> {
    found.disks.iter().find(|d| {
        d.source
            .as_deref()
            .is_some_and(|s| pd.is_source(s, project))
    })
}

fn detach_failed(volume: &VolumeId, code: Option<&str>, message: String) -> CloudError {
    compute(CloudCall::Detach(volume.to_string()), message).with_code(code)
}

fn compute(call: CloudCall, message: impl Into<String>) -> CloudError {
    CloudError::new(Provider::Gce, call, message)
}

fn not_gce(what: &str, id: &str) -> String {
    format!("{what} {id} is not a Compute Engine one")
}

#[async_trait]
impl Cloud for Gce {
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let lookups = ids.iter().map(|id| async move {
            let vm = id.as_gce().ok_or_else(|| {
                compute(
                    CloudCall::DescribeMachines,
                    not_gce("instance", id.as_str()),
                )
            })?;
            let found = self.get(&vm).await.map_err(|e| {
                // The HTTP status is the code: the witness classes a 403.
                let status = e.http_status_code().map(|s| s.to_string());
                compute(
                    CloudCall::DescribeMachines,
                    format!("instances.get {vm}: {e}"),
                )
                .with_code(status.as_deref())
            })?;
            Ok::<_, CloudError>(instance_facts(id, found))
        });
        try_join_all(lookups).await
    }

    /// Never asked: a VM's Node names it by its name, so the VM described
    /// is whichever carries the name now
    /// ([`crate::core::rules::namesake::must_ask`]).
    async fn machines_named(
        &self,
        _name: &str,
        _vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        Ok(Vec::new())
    }

    /// Never asked: a VM's Node names it by its name, which no override
    /// changes ([`crate::core::rules::namesake::must_ask`]).
    async fn machines_holding(
        &self,
        _addresses: &[std::net::IpAddr],
        _vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        Ok(Vec::new())
    }

    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        let lookups = ids.iter().map(|id| async move {
            let pd = id
                .as_pd()
                .ok_or_else(|| compute(CloudCall::DescribeVolumes, not_gce("disk", id.as_str())))?;
            self.disk(id, &pd)
                .await
                .map_err(|e| compute(CloudCall::DescribeVolumes, format!("disks.get {id}: {e}")))
        });
        Ok(try_join_all(lookups).await?.into_iter().flatten().collect())
    }

    async fn detach_volume(&self, volume: &VolumeId, order: &Detach<'_>) -> Result<(), CloudError> {
        let fail = |code: Option<&str>, message: String| detach_failed(volume, code, message);
        let instance = &order.machine.id;
        let (Some(pd), Some(vm)) = (volume.as_pd(), instance.as_gce()) else {
            return Err(fail(None, not_gce("disk or instance", volume.as_str())));
        };
        let (uid, device) = self.device_to_detach(volume, &vm, &pd, order).await?;
        // The same request id for the same fencing's detach: a retried call
        // is one operation, never two, so the call may be retried as
        // idempotent (a POST is not, by default) when its answer is lost;
        // another fencing of the same disk is another operation.
        let request_id = request_id(&vm, &device, uid, order.fencing);
        let sent = self
            .instances
            .detach_disk()
            .set_project(vm.project())
            .set_zone(vm.zone())
            .set_instance(vm.name())
            .set_device_name(&device)
            .set_request_id(request_id)
            .with_idempotency(true)
            .send()
            .await;
        let op = match sent {
            Ok(op) => op,
            // The PD CSI driver's own detach of this disk is running (the
            // attach/detach controller deleted its VolumeAttachment once
            // the pods went): the end wanted is under way, left to the
            // verification as EC2's IncorrectState is.
            Err(e) if is_not_ready(&e) => {
                return Err(fail(
                    Some("NotAttached"),
                    format!("instances.detachDisk {vm} {device}: another detach is under way: {e}"),
                ));
            }
            // The driver's detach may have ended between the read above
            // and this call (Compute Engine then finds no disk of that
            // device name): a VM read again that no longer holds the disk
            // leaves it to the verification too. Anything else fails.
            Err(e) => {
                let code = match self.holds(&vm, &pd).await {
                    Some(false) => Some("NotAttached"),
                    _ => None,
                };
                return Err(fail(
                    code,
                    format!("instances.detachDisk {vm} {device}: {e}"),
                ));
            }
        };
        let deadline = tokio::time::Instant::now() + DETACH_WAIT;
        self.wait(&vm, op, deadline)
            .await
            .map_err(|e| fail(None, e.to_string()))
    }

    async fn status_checks(
        &self,
        _ids: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
        // Compute Engine has no status checks of EC2's kind: none recorded.
        Ok(Vec::new())
    }

    async fn power_off(&self, order: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
        let instance = &order.machine.id;
        let fail = |code: Option<&str>, message: String| {
            compute(CloudCall::PowerOff(instance.to_string()), message).with_code(code)
        };
        let vm = instance
            .as_gce()
            .ok_or_else(|| fail(None, not_gce("instance", instance.as_str())))?;
        // The VM is read again right before the stop: a managed instance
        // group may have recreated it under the same name since the node
        // was judged (a new machine, never stopped for the old one's hang),
        // or something else may be starting or stopping it.
        let found = self
            .get(&vm)
            .await
            .map_err(|e| fail(None, format!("instances.get {vm}: {e}")))?;
        let uid = found.as_ref().and_then(|i| i.id);
        let seen = found.as_ref().map(|i| (i.id, status_of(i)));
        match gce::may_stop(order.machine.identity.uid, seen) {
            Ok(StopStep::AlreadyOff) => return Ok(PowerOffAnswer::FoundOff),
            Ok(StopStep::Deleted) => return Ok(PowerOffAnswer::Deleted),
            Ok(StopStep::Stop) => {}
            Err(held) => return Err(fail(Some("MachineNotRunning"), format!("{vm}: {held}"))),
        }
        // One request id per power-off (the time on the Node's mark): a
        // retried call is one stop, never two.
        let request_id = request_id(&vm, STOP, uid, order.fencing);
        let op = self
            .instances
            .stop()
            .set_project(vm.project())
            .set_zone(vm.zone())
            .set_instance(vm.name())
            // A VM opted in to graceful shutdown would sit PENDING_STOP for
            // its whole maxDuration (up to an hour) before a hung guest is
            // let go, its disks attached and writable. What stays is the
            // ACPI soft-off window (120 s on a standard VM, 30 s on Spot)
            // unless the VM's scheduling skips it: no stop parameter does.
            .set_no_graceful_shutdown(true)
            // Required for a VM with Local SSDs: keep their data (Compute
            // Engine copies it off, which makes the stop slower); a power-off
            // meant to free network disks discards nothing of its own accord.
            .set_discard_local_ssd(false)
            .set_request_id(request_id)
            .with_idempotency(true)
            .send()
            .await
            .map_err(|e| fail(None, format!("instances.stop {vm}: {e}")))?;
        match self.wait(&vm, op, order.until).await {
            Ok(()) => Ok(PowerOffAnswer::Sent),
            // Taken and under way: the mark stays, and the stage's wait (or
            // a retry) sees the VM TERMINATED before any taint.
            Err(Followed::Late(why)) => {
                tracing::warn!(vm = %vm, "{why}: the stop is under way");
                Ok(PowerOffAnswer::Sent)
            }
            Err(Followed::Failed(why)) => Err(fail(None, format!("instances.stop {vm}: {why}"))),
        }
    }
}

/// What a stop's request id is derived from in place of a detach's device
/// name: a device name holds no `/`, so no detach shares it.
const STOP: &str = "/stop";

/// The VM's status as Compute Engine reports it.
fn status_of(vm: &Instance) -> GceStatus {
    vm.status
        .as_ref()
        .and_then(|s| s.name())
        .map_or(GceStatus::Unknown, GceStatus::from_name)
}

/// A request id (a UUID, as Compute Engine requires) derived from the VM,
/// its id, the device (or [`STOP`]) and the fencing: the same fencing's
/// detach or stop always carries the same one, so Compute Engine runs it
/// once however often it is sent within its window, and a later fencing of
/// the same disk, or power-off of the same VM, is not taken for it.
fn request_id(vm: &GceInstance, device: &str, uid: Option<u64>, fencing: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(vm.provider_id().as_bytes());
    hasher.update(uid.unwrap_or_default().to_be_bytes());
    hasher.update(device.as_bytes());
    hasher.update([0]);
    hasher.update(fencing.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hasher.finalize()[..16]);
    // Version 5-like layout: a name-derived UUID.
    bytes[6] = (bytes[6] & 0x0f) | 0x50;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    uuid::Uuid::from_bytes(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_detach_always_has_the_same_request_id() {
        let vm = GceInstance::new("proj-fencer", "us-central1-a", "node-1").expect("a VM");
        let at = "2026-11-26T10:00:00Z";
        let a = request_id(&vm, "pd-1", Some(7), at);
        assert_eq!(a, request_id(&vm, "pd-1", Some(7), at));
        assert_ne!(a, request_id(&vm, "pd-2", Some(7), at));
        assert_ne!(a, request_id(&vm, "pd-1", Some(8), at));
        // Issue 33, item 12: a second fencing of the same VM and disk is
        // another operation, not the first one deduplicated.
        assert_ne!(a, request_id(&vm, "pd-1", Some(7), "2026-11-26T11:00:00Z"));
        assert!(uuid::Uuid::parse_str(&a).is_ok(), "{a}");
        // A stop is neither a detach nor another power-off's stop.
        let stop = request_id(&vm, STOP, Some(7), at);
        assert_eq!(stop, request_id(&vm, STOP, Some(7), at));
        assert_ne!(stop, a);
        assert_ne!(stop, request_id(&vm, STOP, Some(8), at));
        assert_ne!(stop, request_id(&vm, STOP, Some(7), "2026-11-26T11:00:00Z"));
    }

    mod policy {
        use google_cloud_gax::backoff_policy::BackoffPolicy;
        use google_cloud_gax::error::Error;
        use google_cloud_gax::error::rpc::{Code, Status};
        use google_cloud_gax::retry_policy::RetryPolicy as _;
        use google_cloud_gax::retry_state::RetryState;

        use super::super::*;

        const CALL: Duration = Duration::from_secs(30);

        /// An error as the client makes it of Compute Engine's answer: the
        /// HTTP status, and the body's `status`, which Compute Engine may
        /// leave out (then `Unknown`).
        fn answered(http: u16, code: Code) -> Error {
            Error::service_with_http_metadata(Status::default().set_code(code), Some(http), None)
        }

        fn transient() -> Vec<Error> {
            vec![
                answered(503, Code::Unavailable),
                answered(503, Code::Unknown),
                answered(429, Code::ResourceExhausted),
                answered(429, Code::Unknown),
                Error::timeout("the attempt timed out"),
            ]
        }

        fn after(attempts: u32, idempotent: bool) -> RetryState {
            RetryState::new(idempotent).set_attempt_count(attempts)
        }

        #[test]
        fn throttling_unavailability_and_timeouts_are_retried_within_the_attempts() {
            let p = retry_policy(&retry::COMPUTE, CALL);
            let last = retry::COMPUTE.max_attempts;
            for (first, e) in transient().into_iter().zip(transient()) {
                let shown = format!("{e:?}");
                assert!(p.on_error(&after(1, true), first).is_continue(), "{shown}");
                assert!(p.on_error(&after(last, true), e).is_exhausted(), "{shown}");
            }
        }

        #[test]
        fn only_throttling_is_retried_for_a_call_that_is_not_idempotent() {
            let p = retry_policy(&retry::COMPUTE, CALL);
            let throttled = answered(429, Code::Unknown);
            assert!(p.on_error(&after(1, false), throttled).is_continue());
            for e in [answered(503, Code::Unavailable), Error::timeout("held")] {
                assert!(p.on_error(&after(1, false), e).is_permanent());
            }
        }

        #[test]
        fn a_refusal_or_an_internal_error_is_not_retried() {
            let p = retry_policy(&retry::COMPUTE, CALL);
            for (http, code) in [
                (500, Code::Internal),
                (403, Code::PermissionDenied),
                (404, Code::NotFound),
                (400, Code::InvalidArgument),
            ] {
                let e = answered(http, code);
                assert!(p.on_error(&after(1, true), e).is_permanent(), "{http}");
            }
        }

        #[test]
        fn no_retry_starts_past_the_call_budget() {
            let p = retry_policy(&retry::COMPUTE, CALL);
            let Some(start) = std::time::Instant::now().checked_sub(CALL + Duration::from_secs(1))
            else {
                return;
            };
            let late = after(1, true).set_start(start);
            assert!(
                p.on_error(&late, answered(503, Code::Unavailable))
                    .is_exhausted()
            );
            assert_eq!(p.remaining_time(&late), Some(Duration::ZERO));
        }

        #[test]
        fn pauses_start_at_the_base_and_stay_under_the_cap() {
            let b = backoff(&retry::COMPUTE).expect("the policy's backoff is valid");
            for _ in 0..50 {
                assert!(b.on_failure(&after(1, true)) <= retry::COMPUTE.base);
                for n in 2..20u32 {
                    assert!(b.on_failure(&after(n, true)) <= retry::COMPUTE.cap, "{n}");
                }
            }
        }
    }

    #[test]
    fn an_operation_is_looked_at_soon_then_every_two_seconds() {
        let ms = Duration::from_millis;
        let pauses: Vec<Duration> = (0..6).map(poll_pause).collect();
        assert_eq!(
            pauses,
            [ms(200), ms(400), ms(800), ms(1600), ms(2000), ms(2000)]
        );
        assert_eq!(poll_pause(u32::MAX), POLL_MAX);
    }

    mod not_found {
        use google_cloud_gax::error::Error;
        use google_cloud_gax::error::rpc::Status;
        use hyper::body::Bytes;
        use serde_json::json;

        use super::super::{is_not_found, is_not_ready};

        const VM: &str = "projects/proj-fencer/zones/us-central1-a/instances/node-1";

        /// An error as the client makes it of an answer with this status
        /// and body: Google's JSON error is read into a status, anything
        /// else is kept as the bytes it was.
        fn answered(http: u16, body: &str) -> Error {
            let bytes = Bytes::from(body.to_owned());
            match Status::try_from(&bytes) {
                Ok(status) => Error::service_with_http_metadata(status, Some(http), None),
                Err(_) => Error::http(http, http::HeaderMap::new(), bytes),
            }
        }

        /// Compute Engine's error body (`error.errors[]`, no `status`).
        fn google(code: u16, reason: &str, message: &str) -> String {
            json!({"error": {"code": code, "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}]}})
            .to_string()
        }

        fn gone(resource: &str) -> String {
            google(
                404,
                "notFound",
                &format!("The resource '{resource}' was not found"),
            )
        }

        #[test]
        fn compute_engines_own_not_found_for_that_vm_means_deleted() {
            assert!(is_not_found(&answered(404, &gone(VM)), VM));
            // With the `status` field some Google APIs add, the same.
            let with_status = json!({"error": {"code": 404, "status": "NOT_FOUND",
                "message": format!("The resource '{VM}' was not found"),
                "errors": [{"message": "x", "domain": "global", "reason": "notFound"}]}});
            assert!(is_not_found(&answered(404, &with_status.to_string()), VM));
        }

        #[test]
        fn any_other_404_is_a_failed_lookup() {
            for (why, body) in [
                ("a bare 404 of a proxy", String::new()),
                (
                    "an HTML page of a load balancer",
                    "<html><body><h1>404 Not Found</h1></body></html>".to_owned(),
                ),
                (
                    "Google's front end, a wrong endpoint path",
                    google(404, "notFound", "The requested URL /v1/projects was not found on this server."),
                ),
                ("another project", gone("projects/proj-fencer")),
                ("another zone", gone("projects/proj-fencer/zones/us-central1-b/instances/node-1")),
                ("another VM of a longer name", gone(&format!("{VM}0"))),
                ("a VM of a shorter name", gone(&VM[..VM.len() - 1])),
                (
                    "another reason",
                    google(404, "invalid", &format!("The resource '{VM}' was not found")),
                ),
                (
                    "no reason",
                    json!({"error": {"code": 404, "message": format!("The resource '{VM}' was not found")}})
                        .to_string(),
                ),
                (
                    "another status",
                    json!({"error": {"code": 404, "status": "PERMISSION_DENIED",
                        "message": format!("The resource '{VM}' was not found"),
                        "errors": [{"message": "x", "domain": "global", "reason": "notFound"}]}})
                    .to_string(),
                ),
                ("JSON that is no Google error", json!({"error": "not found"}).to_string()),
            ] {
                assert!(!is_not_found(&answered(404, &body), VM), "{why}");
            }
        }

        #[test]
        fn only_resource_not_ready_is_a_detach_under_way() {
            let disk = "projects/proj-fencer/zones/us-central1-a/disks/pv-1";
            let busy = google(
                400,
                "resourceNotReady",
                &format!("The resource '{disk}' is not ready"),
            );
            assert!(is_not_ready(&answered(400, &busy)));
            for (why, e) in [
                (
                    "another reason",
                    answered(400, &google(400, "invalid", "is not ready")),
                ),
                (
                    "another status",
                    answered(409, &google(409, "resourceNotReady", "is not ready")),
                ),
                (
                    "no Google error",
                    answered(400, "The resource is not ready"),
                ),
            ] {
                assert!(!is_not_ready(&e), "{why}");
            }
        }

        #[test]
        fn the_same_words_under_another_status_are_not_deleted() {
            for http in [200, 400, 403, 410, 500, 503] {
                assert!(!is_not_found(&answered(http, &gone(VM)), VM), "{http}");
            }
            assert!(!is_not_found(&Error::timeout("held"), VM));
        }
    }

    #[test]
    fn a_vm_compute_engine_does_not_know_is_off_with_nothing_known() {
        let id = InstanceId::parse("gce://proj-fencer/us-central1-a/node-1").expect("an id");
        let facts = instance_facts(&id, None);
        assert_eq!(facts.state, InstanceState::Terminated);
        assert_eq!(facts.identity, MachineIdentity::default());
        // Deleted: no stop time, so no proof of a silent kubelet either.
        assert_eq!(facts.stopped_at, None);
    }

    /// Issue 39: Compute Engine's `lastStopTimestamp`, in the VM's zone's
    /// offset as it writes it, is the machine's recorded stop.
    #[test]
    fn a_stopped_vm_carries_its_last_stop_time() {
        let id = InstanceId::parse("gce://proj-fencer/us-central1-a/node-1").expect("an id");
        let vm: Instance = serde_json::from_value(serde_json::json!({
            "name": "node-1",
            "status": "TERMINATED",
            "lastStopTimestamp": "2026-11-26T04:00:05.123-08:00",
        }))
        .expect("an instance");
        let facts = instance_facts(&id, Some(vm));
        assert!(facts.state.is_off(), "{:?}", facts.state);
        assert_eq!(
            facts.stopped_at,
            crate::core::model::values::unix_seconds("2026-11-26T12:00:05Z")
        );
    }
}
