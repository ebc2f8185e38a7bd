//! The cloud behind one trait: [`Cloud`] is every call the pipeline makes
//! to the cloud provider, in plain facts; each provider is one module
//! ([`aws`] for EC2, `gce` for Compute Engine), and [`Clouds`] sends each
//! machine and disk to its own. SDK types never leave their module.

pub mod aws;
#[cfg(feature = "gce")]
pub mod gce;

use async_trait::async_trait;

use crate::core::model::facts::{InstanceFacts, StatusChecks, VolumeFacts};
use crate::core::model::instance::{InstanceId, Provider, VolumeId};

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

/// Why a cloud cannot be asked at all.
fn unavailable(provider: Provider) -> String {
    format!(
        "{} cannot be asked: no client for it (Compute Engine needs the `gce` feature, the container image's build, and loadable Google credentials; the log says which)",
        provider.api()
    )
}

impl CloudError {
    /// True when the volume was no longer attached (someone else detached it
    /// first): the end state holds, so it is not a failure.
    pub fn is_already_detached(&self) -> bool {
        matches!(self, Self::DetachVolume { code: Some(code), .. }
            if code == "IncorrectState" || code == "InvalidAttachment.NotFound" || code == "NotAttached")
    }

    /// True when the cloud shell refused the detach for good: the disk is
    /// the machine's boot disk (Compute Engine's shell sees that on the VM
    /// right before the detach, and never asks). The volume is refused, as
    /// an EC2 root device is by the plan; no retry would change that.
    pub fn is_never_detached(&self) -> bool {
        matches!(self, Self::DetachVolume { code: Some(code), .. } if code == "BootDisk")
    }
}

/// A force-detach as the fencing that sends it knows it.
#[derive(Clone, Copy, Debug)]
pub struct Detach<'a> {
    /// The machine as the cloud described it when the node was decided: a
    /// shell that looks at the machine again before the detach (Compute
    /// Engine does) holds the look to it, never to another machine of the
    /// same name.
    pub machine: &'a InstanceFacts,
    /// What names the fencing (the time on the Node's mark): the same
    /// fencing's detach sent again is one operation, another fencing's is
    /// another.
    pub fencing: &'a str,
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
    /// Force-detaches a volume from the machine `order` names, for the
    /// fencing it names.
    async fn detach_volume(&self, volume: &VolumeId, order: &Detach<'_>) -> Result<(), CloudError>;
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

/// Every cloud this build can ask: each machine and each disk goes to the
/// cloud its id names, so one invocation may span both.
pub struct Clouds<'a> {
    /// EC2.
    pub aws: &'a dyn Cloud,
    /// Compute Engine, when this build has it.
    pub gce: Option<&'a dyn Cloud>,
}

impl Clouds<'_> {
    fn of(&self, provider: Provider) -> Option<&dyn Cloud> {
        match provider {
            Provider::Aws => Some(self.aws),
            Provider::Gce => self.gce,
        }
    }
}

/// `ids` split by cloud, in a fixed order.
fn by_provider<T>(ids: &[T], provider: impl Fn(&T) -> Provider) -> Vec<(Provider, Vec<T>)>
where
    T: Clone,
{
    [Provider::Aws, Provider::Gce]
        .into_iter()
        .map(|p| {
            (
                p,
                ids.iter()
                    .filter(|id| provider(id) == p)
                    .cloned()
                    .collect::<Vec<_>>(),
            )
        })
        .filter(|(_, ids)| !ids.is_empty())
        .collect()
}

#[async_trait]
impl Cloud for Clouds<'_> {
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let mut out = Vec::with_capacity(ids.len());
        for (provider, ids) in by_provider(ids, InstanceId::provider) {
            let cloud = self
                .of(provider)
                .ok_or_else(|| CloudError::DescribeInstances(unavailable(provider)))?;
            out.extend(cloud.describe_instances(&ids).await?);
        }
        Ok(out)
    }

    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        let mut out = Vec::with_capacity(ids.len());
        for (provider, ids) in by_provider(ids, VolumeId::provider) {
            let cloud = self
                .of(provider)
                .ok_or_else(|| CloudError::DescribeVolumes(unavailable(provider)))?;
            out.extend(cloud.describe_volumes(&ids).await?);
        }
        Ok(out)
    }

    async fn detach_volume(&self, volume: &VolumeId, order: &Detach<'_>) -> Result<(), CloudError> {
        let provider = volume.provider();
        let instance = &order.machine.id;
        match self.of(provider) {
            Some(cloud) if instance.provider() == provider => {
                cloud.detach_volume(volume, order).await
            }
            Some(_) => Err(CloudError::DetachVolume {
                volume_id: volume.to_string(),
                code: None,
                message: format!("{instance} is not a machine of {}", provider.api()),
            }),
            None => Err(CloudError::DetachVolume {
                volume_id: volume.to_string(),
                code: None,
                message: unavailable(provider),
            }),
        }
    }

    async fn status_checks(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
        let mut out = Vec::new();
        for (provider, ids) in by_provider(ids, InstanceId::provider) {
            if let Some(cloud) = self.of(provider) {
                out.extend(cloud.status_checks(&ids).await?);
            }
        }
        Ok(out)
    }

    async fn power_off(&self, instance: &InstanceId) -> Result<(), CloudError> {
        let provider = instance.provider();
        match self.of(provider) {
            Some(cloud) => cloud.power_off(instance).await,
            None => Err(CloudError::StopInstances {
                instance_id: instance.to_string(),
                message: unavailable(provider),
            }),
        }
    }
}
