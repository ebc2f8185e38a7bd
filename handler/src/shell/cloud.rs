//! The EC2 side: the [`Cloud`] trait the pipeline talks to, and its
//! implementation over `aws-sdk-ec2`. SDK types stay in this file.

use async_trait::async_trait;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::Filter;

use crate::facts::{InstanceFacts, VolumeAttachmentState, VolumeFacts};
use crate::instance::{InstanceId, InstanceState, VolumeId};

/// EC2 filters accept at most 200 values each.
const FILTER_CHUNK: usize = 200;

/// A failed EC2 call, named after the operation.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CloudError {
    /// `DescribeInstances` failed (throttling, permissions, network).
    #[error("DescribeInstances failed: {0}")]
    DescribeInstances(String),
    /// `DescribeVolumes` failed.
    #[error("DescribeVolumes failed: {0}")]
    DescribeVolumes(String),
    /// `DetachVolume` failed for one volume.
    #[error("DetachVolume {volume_id} failed: {message}")]
    DetachVolume {
        /// The volume.
        volume_id: String,
        /// EC2's error code, e.g. `IncorrectState`.
        code: Option<String>,
        /// The error.
        message: String,
    },
}

impl CloudError {
    /// True when the volume was no longer attached (someone else detached it
    /// first): the end state holds, so it is not a failure.
    pub fn is_already_detached(&self) -> bool {
        matches!(self, Self::DetachVolume { code: Some(code), .. }
            if code == "IncorrectState" || code == "InvalidAttachment.NotFound")
    }
}

/// The EC2 calls node-fencer makes. Everything it returns is plain facts.
#[async_trait]
pub trait Cloud: Send + Sync {
    /// Describes the instances; ids EC2 does not know are simply absent.
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError>;
    /// Describes the volumes; ids EC2 does not know are simply absent.
    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError>;
    /// Force-detaches a volume from an instance.
    async fn detach_volume(
        &self,
        volume: &VolumeId,
        instance: &InstanceId,
    ) -> Result<(), CloudError>;
}

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
            let mut pages = self
                .client
                .describe_instances()
                .filters(filter)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| CloudError::DescribeInstances(describe_error(&e)))?;
                for instance in page.reservations().iter().flat_map(|r| r.instances()) {
                    let Some(id) = instance.instance_id().and_then(InstanceId::parse) else {
                        continue;
                    };
                    let state = instance
                        .state()
                        .and_then(|s| s.name())
                        .map_or(InstanceState::Unknown, |n| {
                            InstanceState::from_name(n.as_str())
                        });
                    out.push(InstanceFacts {
                        id,
                        state,
                        private_dns_name: instance.private_dns_name().map(str::to_owned),
                        root_device_name: instance.root_device_name().map(str::to_owned),
                    });
                }
            }
        }
        Ok(out)
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
                let page = page.map_err(|e| CloudError::DescribeVolumes(describe_error(&e)))?;
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
                                state: a.state().map_or("unknown", |s| s.as_str()).to_owned(),
                            })
                        })
                        .collect();
                    out.push(VolumeFacts {
                        id,
                        state: volume.state().map_or("unknown", |s| s.as_str()).to_owned(),
                        attachments,
                    });
                }
            }
        }
        Ok(out)
    }

    async fn detach_volume(
        &self,
        volume: &VolumeId,
        instance: &InstanceId,
    ) -> Result<(), CloudError> {
        self.client
            .detach_volume()
            .volume_id(volume.as_str())
            .instance_id(instance.as_str())
            .force(true)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| CloudError::DetachVolume {
                volume_id: volume.to_string(),
                code: e.code().map(str::to_owned),
                message: describe_error(&e),
            })
    }
}
