//! [`Cloud`] over `aws-sdk-ec2`.

use async_trait::async_trait;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::Filter;

use super::{Cloud, CloudCall, CloudError, Detach, PowerOff, PowerOffAnswer};
use crate::core::model::facts::{InstanceFacts, StatusChecks, VolumeAttachmentState, VolumeFacts};
use crate::core::model::instance::{
    AttachmentState, InstanceId, InstanceState, Provider, VolumeId, VolumeState,
};
use crate::core::rules::silence;

/// EC2 filters accept at most 200 values each.
const FILTER_CHUNK: usize = 200;

/// [`Cloud`] over the AWS SDK.
#[derive(Clone, Debug)]
pub struct Ec2 {
    client: aws_sdk_ec2::Client,
}

impl Ec2 {
    /// Wraps a configured SDK client.
    pub fn new(client: aws_sdk_ec2::Client) -> Self {
        Self { client }
    }
}

fn describe_error<E>(err: &aws_sdk_ec2::error::SdkError<E>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match (err.code(), err.message()) {
        (Some(code), Some(msg)) => format!("{code}: {msg}"),
        (Some(code), None) => code.to_owned(),
        _ => aws_sdk_ec2::error::DisplayErrorContext(err).to_string(),
    }
}

/// A failed EC2 call as a [`CloudError`]: EC2's operation named in the
/// message, its error code kept.
fn ec2<E>(call: CloudCall, operation: &str, err: &aws_sdk_ec2::error::SdkError<E>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    CloudError::new(
        Provider::Aws,
        call,
        format!("{operation}: {}", describe_error(err)),
    )
    .with_code(err.code())
}

impl Ec2 {
    /// Every instance DescribeInstances finds under `filters`, all pages.
    async fn instances(&self, filters: Vec<Filter>) -> Result<Vec<InstanceFacts>, CloudError> {
        let mut out = Vec::new();
        let mut pages = self
            .client
            .describe_instances()
            .set_filters(Some(filters))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| ec2(CloudCall::DescribeMachines, "DescribeInstances", &e))?;
            for instance in page.reservations().iter().flat_map(|r| r.instances()) {
                if let Some(facts) = instance_facts(instance) {
                    out.push(facts);
                }
            }
        }
        Ok(out)
    }
}

/// What DescribeInstances says of one instance; `None` without a valid id.
fn instance_facts(instance: &aws_sdk_ec2::types::Instance) -> Option<InstanceFacts> {
    let id = instance.instance_id().and_then(InstanceId::parse)?;
    let state = instance
        .state()
        .and_then(|s| s.name())
        .map_or(InstanceState::Unknown, |n| {
            InstanceState::from_ec2(
                n.as_str(),
                instance.state_reason().and_then(|r| r.code()),
                instance
                    .hibernation_options()
                    .and_then(|h| h.configured())
                    .unwrap_or(false),
            )
        });
    Some(InstanceFacts {
        id,
        state,
        private_dns_name: instance.private_dns_name().map(str::to_owned),
        vpc_id: instance.vpc_id().map(str::to_owned),
        private_ips: private_ips(instance),
        tags: instance
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_owned(), t.value()?.to_owned())))
            .collect(),
        root_device_name: instance.root_device_name().map(str::to_owned),
        root_volume: root_volume(instance),
        identity: Default::default(),
        stopped_at: instance
            .state_transition_reason()
            .and_then(silence::ec2_stop_time),
        started_at: instance.launch_time().map(|t| t.secs()),
    })
}

#[async_trait]
impl Cloud for Ec2 {
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let mut out = Vec::with_capacity(ids.len());
        // A filter, not InstanceIds: with InstanceIds one unknown id fails the
        // whole call, and one stale event would block the batch.
        for chunk in ids.chunks(FILTER_CHUNK) {
            let filter = Filter::builder()
                .name("instance-id")
                .set_values(Some(chunk.iter().map(|i| i.as_str().to_owned()).collect()))
                .build();
            out.extend(self.instances(vec![filter]).await?);
        }
        Ok(out)
    }

    async fn machines_named(
        &self,
        name: &str,
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let by_name = Filter::builder()
            .name("private-dns-name")
            .values(name)
            .build();
        self.instances(may_be_on(by_name, vpc)).await
    }

    async fn machines_holding(
        &self,
        addresses: &[std::net::IpAddr],
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        if addresses.is_empty() {
            return Ok(Vec::new());
        }
        // The primary private address: the one a kubelet reports as its
        // Node's InternalIP (a secondary one goes to a pod).
        let by_address = Filter::builder()
            .name("private-ip-address")
            .set_values(Some(addresses.iter().map(ToString::to_string).collect()))
            .build();
        self.instances(may_be_on(by_address, vpc)).await
    }

    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(FILTER_CHUNK) {
            let filter = Filter::builder()
                .name("volume-id")
                .set_values(Some(chunk.iter().map(|v| v.as_str().to_owned()).collect()))
                .build();
            let mut pages = self
                .client
                .describe_volumes()
                .filters(filter)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page =
                    page.map_err(|e| ec2(CloudCall::DescribeVolumes, "DescribeVolumes", &e))?;
                for volume in page.volumes() {
                    let Some(id) = volume.volume_id().and_then(VolumeId::parse) else {
                        continue;
                    };
                    let attachments = volume
                        .attachments()
                        .iter()
                        .filter_map(|a| {
                            Some(VolumeAttachmentState {
                                instance: a.instance_id().and_then(InstanceId::parse)?,
                                device: a.device().map(str::to_owned),
                                state: a.state().map_or(AttachmentState::Unknown, |s| {
                                    AttachmentState::from_name(s.as_str())
                                }),
                            })
                        })
                        .collect();
                    out.push(VolumeFacts {
                        id,
                        state: volume
                            .state()
                            .map_or(VolumeState::Unknown, |s| VolumeState::from_name(s.as_str())),
                        attachments,
                    });
                }
            }
        }
        Ok(out)
    }

    async fn detach_volume(&self, volume: &VolumeId, order: &Detach<'_>) -> Result<(), CloudError> {
        // An instance id is never reused, and a forced detach of a volume
        // already detached answers IncorrectState: nothing else to hold.
        self.client
            .detach_volume()
            .volume_id(volume.as_str())
            .instance_id(order.machine.id.as_str())
            .force(true)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| ec2(CloudCall::Detach(volume.to_string()), "DetachVolume", &e))
    }

    async fn status_checks(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(FILTER_CHUNK) {
            let mut pages = self
                .client
                .describe_instance_status()
                .set_instance_ids(Some(chunk.iter().map(|i| i.as_str().to_owned()).collect()))
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page =
                    page.map_err(|e| ec2(CloudCall::StatusChecks, "DescribeInstanceStatus", &e))?;
                for status in page.instance_statuses() {
                    let Some(id) = status.instance_id().and_then(InstanceId::parse) else {
                        continue;
                    };
                    let name = |s: Option<&aws_sdk_ec2::types::InstanceStatusSummary>| {
                        s.and_then(|s| s.status())
                            .map_or("unknown", |s| s.as_str())
                            .to_owned()
                    };
                    out.push((
                        id,
                        StatusChecks {
                            instance: name(status.instance_status()),
                            system: name(status.system_status()),
                        },
                    ));
                }
            }
        }
        Ok(out)
    }

    async fn power_off(&self, order: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
        // An instance id is never reused: the id the node was judged by is
        // the machine stopped.
        let instance = &order.machine.id;
        self.client
            .stop_instances()
            .instance_ids(instance.as_str())
            .force(true)
            .skip_os_shutdown(true)
            .send()
            .await
            .map(|out| {
                // EC2 answers a stop of a stopped instance with the state it
                // was in: nothing was stopped.
                let was_stopped = out.stopping_instances().iter().any(|c| {
                    c.instance_id() == Some(instance.as_str())
                        && c.previous_state().and_then(|s| s.name())
                            == Some(&aws_sdk_ec2::types::InstanceStateName::Stopped)
                });
                if was_stopped {
                    PowerOffAnswer::FoundOff
                } else {
                    PowerOffAnswer::Sent
                }
            })
            .map_err(|e| {
                ec2(
                    CloudCall::PowerOff(instance.to_string()),
                    "StopInstances",
                    &e,
                )
            })
    }
}

fn code_of<E, R>(err: aws_sdk_ec2::error::SdkError<E, R>) -> String
where
    E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match err.as_service_error().and_then(|e| e.code()) {
        Some(code) => code.to_owned(),
        None => aws_sdk_ec2::error::DisplayErrorContext(&err).to_string(),
    }
}

/// Asks EC2, with `DryRun=true`, whether each call node-fencer makes is
/// allowed: the answer per IAM action is `Ok` when the call went through,
/// or the error code (`DryRunOperation` means allowed, `UnauthorizedOperation`
/// denied). Changes nothing.
pub async fn dry_run_probes(ec2: &aws_sdk_ec2::Client) -> Vec<(&'static str, Result<(), String>)> {
    let describe = ec2
        .describe_instances()
        .dry_run(true)
        .send()
        .await
        .map(|_| ())
        .map_err(code_of);
    let volumes = ec2
        .describe_volumes()
        .dry_run(true)
        .send()
        .await
        .map(|_| ())
        .map_err(code_of);
    // Permission is checked before the volume is looked up, so a made-up id
    // answers DryRunOperation or UnauthorizedOperation.
    let detach = ec2
        .detach_volume()
        .volume_id("vol-00000000000000000")
        .force(true)
        .dry_run(true)
        .send()
        .await
        .map(|_| ())
        .map_err(code_of);
    vec![
        ("DescribeInstances", describe),
        ("DescribeVolumes", volumes),
        ("DetachVolume", detach),
    ]
}

/// Asks EC2, with `DryRun=true`, whether `DescribeInstanceStatus` (active
/// fencing) is allowed, answered as [`dry_run_probes`] answers.
pub async fn status_probe(ec2: &aws_sdk_ec2::Client) -> (&'static str, Result<(), String>) {
    let answer = ec2
        .describe_instance_status()
        .dry_run(true)
        .send()
        .await
        .map(|_| ())
        .map_err(code_of);
    ("DescribeInstanceStatus", answer)
}

/// Asks EC2, with `DryRun=true`, whether a forced stop of `instance` is
/// allowed (active fencing): the grant is held to the cluster's tagged
/// instances, so it is asked on one of them. Stops nothing.
pub async fn stop_probe(ec2: &aws_sdk_ec2::Client, instance: &InstanceId) -> Result<(), String> {
    ec2.stop_instances()
        .instance_ids(instance.as_str())
        .force(true)
        .dry_run(true)
        .send()
        .await
        .map(|_| ())
        .map_err(code_of)
}

/// The EBS volume mapped at the instance's root device.
fn root_volume(instance: &aws_sdk_ec2::types::Instance) -> Option<VolumeId> {
    let root = instance.root_device_name()?;
    instance
        .block_device_mappings()
        .iter()
        .find(|m| m.device_name() == Some(root))
        .and_then(|m| m.ebs()?.volume_id())
        .and_then(VolumeId::parse)
}

/// Filters for the instances `first` selects that may be on (every state but
/// stopped and terminated), in `vpc` when one is named.
fn may_be_on(first: Filter, vpc: Option<&str>) -> Vec<Filter> {
    let mut filters = vec![
        first,
        Filter::builder()
            .name("instance-state-name")
            .set_values(Some(
                ["pending", "running", "stopping", "shutting-down"]
                    .map(str::to_owned)
                    .to_vec(),
            ))
            .build(),
    ];
    if let Some(vpc) = vpc {
        filters.push(Filter::builder().name("vpc-id").values(vpc).build());
    }
    filters
}

/// Every private address of the instance: the primary one and those of each
/// network interface.
fn private_ips(instance: &aws_sdk_ec2::types::Instance) -> Vec<std::net::IpAddr> {
    let interfaces = instance.network_interfaces().iter().flat_map(|n| {
        n.private_ip_addresses()
            .iter()
            .filter_map(|a| a.private_ip_address())
    });
    let mut ips: Vec<std::net::IpAddr> = instance
        .private_ip_address()
        .into_iter()
        .chain(interfaces)
        .filter_map(|a| a.parse().ok())
        .collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}
