//! The machines' providers behind one trait: [`Cloud`] is every call the
//! pipeline makes to a machine provider, in plain facts; each provider is
//! one module ([`aws`] for EC2, `gce` for Compute Engine, `redfish` for
//! on-premises BMCs), and [`Clouds`] sends each machine and disk to its
//! own. SDK types never leave their module.

pub mod aws;
#[cfg(feature = "redfish")]
pub mod census;
#[cfg(feature = "google-cloud")]
pub mod gce;
#[cfg(feature = "redfish")]
pub mod redfish;
pub mod witness;

use std::net::IpAddr;

use async_trait::async_trait;

use crate::core::model::facts::{InstanceFacts, StatusChecks, VolumeFacts};
use crate::core::model::instance::{InstanceId, Provider, VolumeId};
use crate::core::outbound::metrics::Dependency;

/// A failed call to a cloud's API: which cloud (so metrics and alarms
/// tell them apart), what was asked, and the cloud's own error code where
/// it gave one.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{}: {call} failed: {message}", provider.api())]
pub struct CloudError {
    /// The cloud asked.
    pub provider: Provider,
    /// What it was asked.
    pub call: CloudCall,
    /// The cloud's error code (EC2's `IncorrectState`), or the shell's word
    /// for what it saw (`NotAttached`, `BootDisk`, `MachineNotOff`).
    pub code: Option<String>,
    /// The error.
    pub message: String,
}

/// What a cloud was asked, in the words of the [`Cloud`] trait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudCall {
    /// The machines' states.
    DescribeMachines,
    /// The volumes' states and attachments.
    DescribeVolumes,
    /// The force-detach of one volume.
    Detach(String),
    /// The power-off of one machine.
    PowerOff(String),
    /// The machines' status checks.
    StatusChecks,
    /// A permission a fencing needs, tested without acting (a dry run).
    Permission(String),
}

impl std::fmt::Display for CloudCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DescribeMachines => f.write_str("describing machines"),
            Self::DescribeVolumes => f.write_str("describing volumes"),
            Self::Detach(volume) => write!(f, "detaching {volume}"),
            Self::PowerOff(machine) => write!(f, "powering off {machine}"),
            Self::StatusChecks => f.write_str("reading status checks"),
            Self::Permission(permission) => write!(f, "testing {permission}"),
        }
    }
}

/// Why a cloud cannot be asked at all.
fn unavailable(provider: Provider) -> String {
    format!(
        "{} cannot be asked: no client for it (Compute Engine needs the `google-cloud` feature (the Cloud Run image) and loadable Google credentials; Redfish needs the `redfish` feature (the on-premises image) and REDFISH_INVENTORY; the log says which)",
        provider.api()
    )
}

impl CloudError {
    /// A failed `call` to `provider`'s API.
    pub fn new(provider: Provider, call: CloudCall, message: impl Into<String>) -> Self {
        Self {
            provider,
            call,
            code: None,
            message: message.into(),
        }
    }

    /// The same error, with the cloud's code for it.
    pub fn with_code(self, code: Option<&str>) -> Self {
        Self {
            code: code.map(str::to_owned),
            ..self
        }
    }

    /// The dependency the metrics count the failure against.
    pub fn dependency(&self) -> Dependency {
        Dependency::cloud(self.provider)
    }

    fn detach_code(&self) -> Option<&str> {
        matches!(self.call, CloudCall::Detach(_))
            .then_some(self.code.as_deref())
            .flatten()
    }

    /// True when the volume was no longer attached (someone else detached it
    /// first): the end state holds, so it is not a failure.
    pub fn is_already_detached(&self) -> bool {
        matches!(
            self.detach_code(),
            Some("IncorrectState" | "InvalidAttachment.NotFound" | "NotAttached")
        )
    }

    /// True when the cloud shell refused the detach for good: the disk is
    /// the machine's boot disk (Compute Engine's shell sees that on the VM
    /// right before the detach, and never asks). The volume is refused, as
    /// an EC2 root device is by the plan; no retry would change that.
    pub fn is_never_detached(&self) -> bool {
        self.detach_code() == Some("BootDisk")
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

/// A power-off as the active fencing that sends it knows it.
#[derive(Clone, Copy, Debug)]
pub struct PowerOff<'a> {
    /// The machine as the cloud described it when the node was judged: a
    /// shell that looks at the machine again before the stop (Compute
    /// Engine does) holds the look to it, never to another machine of the
    /// same name.
    pub machine: &'a InstanceFacts,
    /// What names this power-off (the time on the Node's power-off mark):
    /// the same power-off sent again is one operation, a later one another.
    pub fencing: &'a str,
    /// How long a shell that follows the stop to its end (Compute Engine's
    /// operation) may follow it: a stop still under way then is accepted,
    /// and the wait for the machine to be off goes on in the stage.
    pub until: tokio::time::Instant,
}

/// What one look at several machines found: the machines described, and
/// each failed call with the machines it was about. A machine in neither is
/// one the provider does not know.
#[derive(Debug, Default)]
pub struct Described {
    /// The machines described.
    pub found: Vec<InstanceFacts>,
    /// The calls that failed, with the machines each was asking about.
    pub failed: Vec<(Vec<InstanceId>, CloudError)>,
}

impl Described {
    fn of(ids: &[InstanceId], described: Result<Vec<InstanceFacts>, CloudError>) -> Self {
        match described {
            Ok(found) => Self {
                found,
                failed: Vec::new(),
            },
            Err(e) => Self {
                found: Vec::new(),
                failed: vec![(ids.to_vec(), e)],
            },
        }
    }

    fn extend(&mut self, other: Self) {
        self.found.extend(other.found);
        self.failed.extend(other.failed);
    }
}

/// The calls node-fencer makes to a machine provider. Everything it
/// returns is plain facts.
#[async_trait]
pub trait Cloud: Send + Sync {
    /// Describes the machines; ids the cloud does not know are simply absent.
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError>;
    /// Describes the machines that carry `name` as the cloud's own name for
    /// them and may run (EC2's private DNS name; any state but stopped and
    /// terminated), in `vpc` when it is given
    /// ([`crate::core::rules::namesake`]). A provider whose machines carry
    /// no such name finds none. No default, for the reason
    /// [`Cloud::machines_holding`] has none.
    async fn machines_named(
        &self,
        name: &str,
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError>;
    /// Describes the machines that hold one of `addresses` as a private
    /// address and may run (any state but stopped and terminated), in `vpc`
    /// when it is given ([`crate::core::rules::namesake`]). No default: a
    /// wrapper that forgot to pass it on would find no holder, and fence.
    async fn machines_holding(
        &self,
        addresses: &[IpAddr],
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError>;
    /// Describes the volumes; ids the cloud does not know are simply absent.
    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError>;
    /// Describes the machines, each failure apart: a provider whose machines
    /// answer one by one (a BMC each) fails one machine's look, not the
    /// others'. By default, one batched call whose error is every machine's.
    async fn describe_each(&self, ids: &[InstanceId]) -> Described {
        Described::of(ids, self.describe_instances(ids).await)
    }
    /// Force-detaches a volume from the machine `order` names, for the
    /// fencing it names.
    async fn detach_volume(&self, volume: &VolumeId, order: &Detach<'_>) -> Result<(), CloudError>;
    /// The status checks of running machines (active fencing records
    /// them); machines the cloud reports none for are absent.
    async fn status_checks(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError>;
    /// Powers the machine `order` names off at once: forced, without the
    /// guest's shutdown (active fencing; a hung guest would only delay it).
    /// `Ok` means the cloud took the stop, or found the machine off
    /// already: the stage still waits for the cloud to report it off.
    async fn power_off(&self, order: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError>;
}

/// What a power-off found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerOffAnswer {
    /// The stop was sent and taken (or one sent before is under way).
    Sent,
    /// The machine was off already: nothing was sent.
    FoundOff,
    /// The machine no longer exists (Compute Engine's own `notFound` for
    /// it): nothing was sent.
    Deleted,
}

/// Every provider this build can ask: each machine and each disk goes to
/// the provider its id names, so one invocation may span them.
pub struct Clouds<'a> {
    /// EC2.
    pub aws: &'a dyn Cloud,
    /// Compute Engine, when this build has it.
    pub gce: Option<&'a dyn Cloud>,
    /// The BMCs of the inventory, when one is configured.
    pub redfish: Option<&'a dyn Cloud>,
}

impl Clouds<'_> {
    fn of(&self, provider: Provider) -> Option<&dyn Cloud> {
        match provider {
            Provider::Aws => Some(self.aws),
            Provider::Gce => self.gce,
            Provider::Redfish => self.redfish,
        }
    }
}

/// `ids` split by cloud, in a fixed order.
fn by_provider<T>(ids: &[T], provider: impl Fn(&T) -> Provider) -> Vec<(Provider, Vec<T>)>
where
    T: Clone,
{
    [Provider::Aws, Provider::Gce, Provider::Redfish]
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
            let cloud = self.of(provider).ok_or_else(|| {
                CloudError::new(provider, CloudCall::DescribeMachines, unavailable(provider))
            })?;
            out.extend(cloud.describe_instances(&ids).await?);
        }
        Ok(out)
    }

    async fn machines_named(
        &self,
        name: &str,
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        self.aws.machines_named(name, vpc).await
    }

    async fn machines_holding(
        &self,
        addresses: &[IpAddr],
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        self.aws.machines_holding(addresses, vpc).await
    }

    async fn describe_each(&self, ids: &[InstanceId]) -> Described {
        let mut out = Described::default();
        for (provider, ids) in by_provider(ids, InstanceId::provider) {
            out.extend(match self.of(provider) {
                Some(cloud) => cloud.describe_each(&ids).await,
                None => Described::of(
                    &ids,
                    Err(CloudError::new(
                        provider,
                        CloudCall::DescribeMachines,
                        unavailable(provider),
                    )),
                ),
            });
        }
        out
    }

    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        let mut out = Vec::with_capacity(ids.len());
        for (provider, ids) in by_provider(ids, VolumeId::provider) {
            let cloud = self.of(provider).ok_or_else(|| {
                CloudError::new(provider, CloudCall::DescribeVolumes, unavailable(provider))
            })?;
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
            Some(_) => Err(CloudError::new(
                provider,
                CloudCall::Detach(volume.to_string()),
                format!("{instance} is not a machine of {}", provider.api()),
            )),
            None => Err(CloudError::new(
                provider,
                CloudCall::Detach(volume.to_string()),
                unavailable(provider),
            )),
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

    async fn power_off(&self, order: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
        let instance = &order.machine.id;
        let provider = instance.provider();
        match self.of(provider) {
            Some(cloud) => cloud.power_off(order).await,
            None => Err(CloudError::new(
                provider,
                CloudCall::PowerOff(instance.to_string()),
                unavailable(provider),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::InstanceFacts;
    use crate::core::model::instance::InstanceState;

    /// EC2, never asked here.
    struct Idle;

    #[async_trait]
    impl Cloud for Idle {
        async fn describe_instances(
            &self,
            _: &[InstanceId],
        ) -> Result<Vec<InstanceFacts>, CloudError> {
            Ok(Vec::new())
        }
        async fn machines_named(
            &self,
            _: &str,
            _: Option<&str>,
        ) -> Result<Vec<InstanceFacts>, CloudError> {
            Ok(Vec::new())
        }
        async fn machines_holding(
            &self,
            _: &[IpAddr],
            _: Option<&str>,
        ) -> Result<Vec<InstanceFacts>, CloudError> {
            Ok(Vec::new())
        }
        async fn describe_volumes(&self, _: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
            Ok(Vec::new())
        }
        async fn detach_volume(&self, _: &VolumeId, _: &Detach<'_>) -> Result<(), CloudError> {
            Ok(())
        }
        async fn status_checks(
            &self,
            _: &[InstanceId],
        ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
            Ok(Vec::new())
        }
        async fn power_off(&self, _: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
            Ok(PowerOffAnswer::Sent)
        }
    }

    /// BMCs, one machine each: one that answers, one that does not.
    struct Bmcs;

    #[async_trait]
    impl Cloud for Bmcs {
        async fn describe_instances(
            &self,
            ids: &[InstanceId],
        ) -> Result<Vec<InstanceFacts>, CloudError> {
            Err(CloudError::new(
                Provider::Redfish,
                CloudCall::DescribeMachines,
                format!("{} machines asked at once", ids.len()),
            ))
        }
        async fn describe_each(&self, ids: &[InstanceId]) -> Described {
            let mut out = Described::default();
            for id in ids {
                if id.as_str().ends_with("-up") {
                    out.found
                        .push(InstanceFacts::bare(id.clone(), InstanceState::Stopped));
                } else {
                    let e = CloudError::new(
                        Provider::Redfish,
                        CloudCall::DescribeMachines,
                        "the BMC does not answer",
                    );
                    out.failed.push((vec![id.clone()], e));
                }
            }
            out
        }
        async fn machines_named(
            &self,
            _: &str,
            _: Option<&str>,
        ) -> Result<Vec<InstanceFacts>, CloudError> {
            Ok(Vec::new())
        }
        async fn machines_holding(
            &self,
            _: &[IpAddr],
            _: Option<&str>,
        ) -> Result<Vec<InstanceFacts>, CloudError> {
            Ok(Vec::new())
        }
        async fn describe_volumes(&self, _: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
            Ok(Vec::new())
        }
        async fn detach_volume(&self, _: &VolumeId, _: &Detach<'_>) -> Result<(), CloudError> {
            Ok(())
        }
        async fn status_checks(
            &self,
            _: &[InstanceId],
        ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
            Ok(Vec::new())
        }
        async fn power_off(&self, _: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
            Ok(PowerOffAnswer::Sent)
        }
    }

    /// A BMC that does not answer fails its own machine's look only; the
    /// clouds' machines keep their batched look, and without a Redfish
    /// client every on-premises machine's look fails, counted as Redfish's.
    #[tokio::test]
    async fn each_machine_behind_a_bmc_is_looked_at_apart() {
        let id = |raw: &str| InstanceId::parse(raw).expect("an id");
        let (up, down, ec2) = (
            id("redfish://rack1-up"),
            id("redfish://rack1-down"),
            id("i-0123456789abcdef0"),
        );
        let ids = [up.clone(), down.clone(), ec2.clone()];
        let clouds = Clouds {
            aws: &Idle,
            gce: None,
            redfish: Some(&Bmcs),
        };
        let looked = clouds.describe_each(&ids).await;
        let found: Vec<&InstanceId> = looked.found.iter().map(|f| &f.id).collect();
        assert_eq!(found, [&up]);
        assert_eq!(looked.failed.len(), 1);
        assert_eq!(looked.failed[0].0, std::slice::from_ref(&down));
        assert_eq!(looked.failed[0].1.dependency(), Dependency::Redfish);

        let without = Clouds {
            aws: &Idle,
            gce: None,
            redfish: None,
        };
        let looked = without.describe_each(&ids).await;
        assert!(looked.found.is_empty());
        assert_eq!(looked.failed.len(), 1);
        assert_eq!(looked.failed[0].0, [up, down]);
        assert!(
            looked.failed[0].1.to_string().starts_with("Redfish: "),
            "{}",
            looked.failed[0].1
        );
    }

    /// Dashboards and alarms tell the clouds apart: a failure of Compute
    /// Engine is never counted as EC2's, nor named with EC2's words.
    #[tokio::test]
    async fn a_compute_engine_failure_is_counted_and_named_as_compute_engines() {
        let clouds = Clouds {
            aws: &Idle,
            gce: None,
            redfish: None,
        };
        let vm = InstanceId::parse("gce://proj-fencer/us-central1-a/node-2").expect("a VM");
        let failed = clouds
            .describe_instances(std::slice::from_ref(&vm))
            .await
            .expect_err("no Compute Engine client");
        assert_eq!(failed.dependency(), Dependency::ComputeEngine);
        assert_eq!(failed.dependency().name(), "ComputeEngine");
        assert!(
            failed.to_string().starts_with("Compute Engine: "),
            "{failed}"
        );
        assert!(!failed.to_string().contains("EC2"), "{failed}");

        let disk =
            VolumeId::parse("projects/proj-fencer/zones/us-central1-a/disks/pv-1").expect("a disk");
        let machine = InstanceFacts::bare(vm, InstanceState::Terminated);
        let order = Detach {
            machine: &machine,
            fencing: "2026-11-26T12:00:00Z",
        };
        let failed = clouds
            .detach_volume(&disk, &order)
            .await
            .expect_err("no Compute Engine client");
        assert_eq!(failed.dependency(), Dependency::ComputeEngine);
        assert!(!failed.is_already_detached() && !failed.is_never_detached());
    }
}
