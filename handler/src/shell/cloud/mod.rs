//! The cloud behind one trait: [`Cloud`] is every call the pipeline makes
//! to the cloud provider, in plain facts; each provider is one module
//! ([`aws`] for EC2). SDK types never leave their module.

pub mod aws;

use async_trait::async_trait;

use crate::core::facts::{InstanceFacts, StatusChecks, VolumeFacts};
use crate::core::instance::{InstanceId, VolumeId};

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
    /// `StopInstances` failed for one instance.
    #[error("StopInstances {instance_id} failed: {message}")]
    StopInstances {
        /// The instance.
        instance_id: String,
        /// The error.
        message: String,
    },
    /// `DescribeInstanceStatus` failed.
    #[error("DescribeInstanceStatus failed: {0}")]
    DescribeInstanceStatus(String),
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
    /// The status checks of running instances (active fencing records
    /// them); instances EC2 reports none for are absent.
    async fn status_checks(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError>;
    /// Powers an instance off at once: forced, without the guest's shutdown
    /// (active fencing; a hung guest would only delay it).
    async fn power_off(&self, instance: &InstanceId) -> Result<(), CloudError>;
}
