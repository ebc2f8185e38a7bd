//! Machine and disk identifiers and machine states, parsed once into types
//! so that no decision ever compares strings. A machine is an EC2 instance,
//! a Compute Engine VM or an on-premises machine behind a Redfish BMC, a
//! disk an EBS volume or a Persistent Disk: the core treats them alike, and
//! [`Provider`] tells the shell whom to ask.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::core::model::gce::{GceInstance, GceStatus, PD_CSI_DRIVER, PdDisk};
use crate::core::model::redfish::{self, BmcMachine, PowerState};

/// The cloud a machine or a disk belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// EC2 and EBS.
    Aws,
    /// Compute Engine and Persistent Disk.
    Gce,
    /// On-premises machines, through their BMCs' Redfish API; no disks.
    Redfish,
}

impl Provider {
    /// The name of its machine API, for messages.
    pub fn api(self) -> &'static str {
        match self {
            Self::Aws => "EC2",
            Self::Gce => "Compute Engine",
            Self::Redfish => "Redfish",
        }
    }
}

/// A machine: an EC2 instance id (`i-` followed by 8 or 17 hex digits), a
/// Compute Engine VM as its Node's provider id names it
/// (`gce://PROJECT/ZONE/NAME`), or a machine of the BMC inventory
/// (`redfish://NAME`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct InstanceId(String);

impl InstanceId {
    /// Parses an EC2 instance id, a GCE provider id or a Redfish machine's
    /// id, strictly.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ec2(raw)
            .or_else(|| GceInstance::from_provider_id(raw).map(|vm| Self::gce(&vm)))
            .or_else(|| BmcMachine::from_id(raw).map(|m| Self::redfish(&m)))
    }

    /// The id of a machine of the BMC inventory.
    pub fn redfish(machine: &BmcMachine) -> Self {
        Self(machine.id())
    }

    /// The inventory's machine, when it is one.
    pub fn as_redfish(&self) -> Option<BmcMachine> {
        BmcMachine::from_id(&self.0)
    }

    /// The machine of a Compute Engine VM.
    pub fn gce(vm: &GceInstance) -> Self {
        Self(vm.provider_id())
    }

    /// The cloud it belongs to.
    pub fn provider(&self) -> Provider {
        if self.0.starts_with("gce://") {
            Provider::Gce
        } else if self.0.starts_with(redfish::SCHEME) {
            Provider::Redfish
        } else {
            Provider::Aws
        }
    }

    /// The Compute Engine VM, when it is one.
    pub fn as_gce(&self) -> Option<GceInstance> {
        GceInstance::from_provider_id(&self.0)
    }

    /// Parses an EC2 instance id, rejecting anything that is not `i-<8 or 17 hex>`.
    ///
    /// Strict parsing matters: the id ends up in EC2 filters and in log lines,
    /// and a loose match (`i-` prefix only) would let label values such as
    /// `i-am-a-node` pass for instances.
    pub fn ec2(raw: &str) -> Option<Self> {
        let hex = raw.strip_prefix("i-")?;
        let valid_len = hex.len() == 8 || hex.len() == 17;
        let all_hex = hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (valid_len && all_hex).then(|| Self(raw.to_owned()))
    }

    /// The id as EC2 spells it, or the VM's provider id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for InstanceId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "`{raw}` is not an EC2 instance id (i- followed by 8 or 17 hex digits), a GCE provider id (gce://PROJECT/ZONE/NAME) nor a Redfish machine (redfish://NAME)"
            ))
        })
    }
}

/// The CSI driver name of the EBS CSI driver.
pub const EBS_CSI_DRIVER: &str = "ebs.csi.aws.com";

/// True for the CSI drivers of the clouds' own disks, which node-fencer
/// detaches: EBS and Persistent Disk. Other drivers' volumes are theirs.
pub fn is_cloud_disk_driver(driver: &str) -> bool {
    driver == EBS_CSI_DRIVER || driver == PD_CSI_DRIVER
}

/// The disk a CSI volume handle of a cloud disk driver names.
pub fn cloud_disk(driver: &str, handle: &str) -> Option<VolumeId> {
    match driver {
        EBS_CSI_DRIVER => VolumeId::ebs(handle),
        PD_CSI_DRIVER => VolumeId::pd(handle),
        _ => None,
    }
}

/// A disk: an EBS volume id (`vol-` followed by 8 or 17 hex digits), or a
/// Persistent Disk as its PD CSI volume handle names it
/// (`projects/P/zones/Z/disks/D`, `projects/P/regions/R/disks/D`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct VolumeId(String);

impl VolumeId {
    /// Parses an EBS volume id or a PD CSI volume handle, strictly.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ebs(raw).or_else(|| Self::pd(raw))
    }

    /// Parses a PD CSI volume handle.
    pub fn pd(handle: &str) -> Option<Self> {
        PdDisk::from_handle(handle).map(|_| Self(handle.to_owned()))
    }

    /// The cloud it belongs to.
    pub fn provider(&self) -> Provider {
        if self.0.starts_with("projects/") {
            Provider::Gce
        } else {
            Provider::Aws
        }
    }

    /// The Persistent Disk an attached disk's `source` URL names
    /// (`https://…/compute/v1/projects/P/zones/Z/disks/D`), as its PD CSI
    /// handle.
    pub fn from_pd_source(source: &str) -> Option<Self> {
        let path = source
            .split_once("/compute/v1/")
            .map_or(source, |(_, path)| path);
        Self::pd(path)
    }

    /// The Persistent Disk, when it is one.
    pub fn as_pd(&self) -> Option<PdDisk> {
        PdDisk::from_handle(&self.0)
    }

    /// The disk, its `UNSPECIFIED` project made the project of `machine`:
    /// in-tree `gcePersistentDisk` volumes migrated to CSI leave the project
    /// to the VM's.
    pub fn on_machine(self, machine: Option<&InstanceId>) -> Self {
        match (self.as_pd(), machine.and_then(InstanceId::as_gce)) {
            (Some(pd), Some(vm)) if pd.project.is_none() => Self(self.0.replacen(
                "projects/UNSPECIFIED/",
                &format!("projects/{}/", vm.project()),
                1,
            )),
            _ => self,
        }
    }

    /// Parses an EBS volume id; also accepts the in-tree `aws://<az>/vol-…` form.
    pub fn ebs(raw: &str) -> Option<Self> {
        let id = raw.rsplit('/').next().unwrap_or(raw);
        let hex = id.strip_prefix("vol-")?;
        let valid_len = hex.len() == 8 || hex.len() == 17;
        let all_hex = hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (valid_len && all_hex).then(|| Self(id.to_owned()))
    }

    /// The id as EC2 spells it, or the PD CSI volume handle.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name a pod spec gives the disk inline: the EBS volume id, or the
    /// Persistent Disk's name (`gcePersistentDisk.pdName`).
    pub fn disk_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The machine a Node's `spec.providerID` names: an AWS one
/// (`aws:///us-east-1a/i-0123456789abcdef0`, or the older `aws:///i-…`) or
/// a GCE one (`gce://PROJECT/ZONE/NAME`).
pub(crate) fn instance_from_provider_id(provider_id: &str) -> Option<InstanceId> {
    if provider_id.starts_with("gce://") {
        return GceInstance::from_provider_id(provider_id).map(|vm| InstanceId::gce(&vm));
    }
    let path = provider_id.strip_prefix("aws://")?;
    InstanceId::ec2(path.rsplit('/').next()?)
}

/// The EC2 instance lifecycle states, as `DescribeInstances` reports them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Booting.
    Pending,
    /// Running: its disks may be written to at any moment.
    Running,
    /// Stopping: the OS may still be flushing to its disks.
    Stopping,
    /// Stopped: nothing runs, the disks are quiet.
    Stopped,
    /// Terminating: may still be running its shutdown.
    ShuttingDown,
    /// Terminated: gone for good.
    Terminated,
    /// Stopped by hibernation: EC2 says `stopped`, but the instance resumes
    /// from the RAM it saved, with whatever it meant to write still in it.
    Hibernated,
    /// Compute Engine's `SUSPENDING` or `SUSPENDED`: like a hibernation, it
    /// resumes from RAM; unlike one, never taken for off.
    Suspended,
    /// A state this build does not know; never treated as off.
    #[serde(other)]
    Unknown,
}

impl InstanceState {
    /// Maps EC2's state name; unknown names become [`InstanceState::Unknown`].
    pub(crate) fn from_name(name: &str) -> Self {
        match name {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "stopping" => Self::Stopping,
            "stopped" => Self::Stopped,
            "shutting-down" => Self::ShuttingDown,
            "terminated" => Self::Terminated,
            "suspended" => Self::Suspended,
            _ => Self::Unknown,
        }
    }

    /// True only for the states in which the instance cannot write to a disk.
    pub(crate) fn is_off(&self) -> bool {
        match self {
            Self::Stopped | Self::Terminated => true,
            Self::Pending
            | Self::Running
            | Self::Stopping
            | Self::ShuttingDown
            | Self::Hibernated
            | Self::Suspended
            | Self::Unknown => false,
        }
    }

    /// True for the states on the way to off (`stopping`, `shutting-down`):
    /// not off yet, soon.
    pub(crate) fn is_stopping(&self) -> bool {
        matches!(self, Self::Stopping | Self::ShuttingDown)
    }

    /// EC2's name for the state.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::ShuttingDown => "shutting-down",
            Self::Terminated => "terminated",
            Self::Hibernated => "hibernated",
            Self::Suspended => "suspended",
            Self::Unknown => "unknown",
        }
    }

    /// Compute Engine's status in these terms. `TERMINATED` and `STOPPED`
    /// both mean the VM is stopped and may be started again, as an EC2
    /// `stopped` instance may; a deleted VM is not described at all.
    pub fn from_gce(status: GceStatus) -> Self {
        match status {
            GceStatus::Pending | GceStatus::Provisioning | GceStatus::Staging => Self::Pending,
            GceStatus::Running => Self::Running,
            GceStatus::Stopping | GceStatus::PendingStop | GceStatus::Deprovisioning => {
                Self::Stopping
            }
            GceStatus::Stopped | GceStatus::Terminated => Self::Stopped,
            GceStatus::Suspending | GceStatus::Suspended => Self::Suspended,
            GceStatus::Repairing | GceStatus::Unknown => Self::Unknown,
        }
    }

    /// A Redfish power state in these terms: `Off` is stopped (the machine
    /// may be powered on again, as a stopped instance may be started); a
    /// paused system resumes from its memory, like a suspended VM.
    pub fn from_redfish(power: PowerState) -> Self {
        match power {
            PowerState::On => Self::Running,
            PowerState::Off => Self::Stopped,
            PowerState::PoweringOn => Self::Pending,
            PowerState::PoweringOff => Self::Stopping,
            PowerState::Paused => Self::Suspended,
            PowerState::Unknown => Self::Unknown,
        }
    }

    /// Classifies what `DescribeInstances` says: its state name, the code of
    /// its `StateReason`, and whether hibernation is configured. A `stopped`
    /// instance whose last stop was a hibernation (`Client.UserInitiatedHibernate`,
    /// or any code naming hibernation) is [`InstanceState::Hibernated`]; so is
    /// one configured for hibernation whose reason is not given, since
    /// nothing then says its RAM was let go.
    pub fn from_ec2(name: &str, reason_code: Option<&str>, hibernation_configured: bool) -> Self {
        let state = Self::from_name(name);
        if state != Self::Stopped {
            return state;
        }
        let hibernated = match reason_code {
            Some(code) => code.to_ascii_lowercase().contains("hibernat"),
            None => hibernation_configured,
        };
        if hibernated { Self::Hibernated } else { state }
    }

    /// Every state, for exhaustive tests.
    pub const ALL: [InstanceState; 9] = [
        Self::Pending,
        Self::Running,
        Self::Stopping,
        Self::Stopped,
        Self::ShuttingDown,
        Self::Terminated,
        Self::Hibernated,
        Self::Suspended,
        Self::Unknown,
    ];
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An EBS volume's state, as `DescribeVolumes` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeState {
    /// Being created.
    Creating,
    /// Attached to no instance: free for another node.
    Available,
    /// Attached to an instance.
    InUse,
    /// Being deleted.
    Deleting,
    /// Deleted.
    Deleted,
    /// Impaired.
    Error,
    /// A state this build does not know; never taken for free.
    #[serde(other)]
    Unknown,
}

impl VolumeState {
    /// Maps EC2's state name; unknown names become [`VolumeState::Unknown`].
    pub fn from_name(name: &str) -> Self {
        match name {
            "creating" => Self::Creating,
            "available" => Self::Available,
            "in-use" => Self::InUse,
            "deleting" => Self::Deleting,
            "deleted" => Self::Deleted,
            "error" => Self::Error,
            _ => Self::Unknown,
        }
    }

    /// EC2's name for the state.
    pub fn name(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Available => "available",
            Self::InUse => "in-use",
            Self::Deleting => "deleting",
            Self::Deleted => "deleted",
            Self::Error => "error",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for VolumeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The state of one attachment of an EBS volume to an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachmentState {
    /// Being attached.
    Attaching,
    /// Attached.
    Attached,
    /// Being detached: the instance may still hold it.
    Detaching,
    /// Detached: the instance no longer holds it.
    Detached,
    /// Attached and busy.
    Busy,
    /// A state this build does not know; taken for attached.
    #[serde(other)]
    Unknown,
}

impl AttachmentState {
    /// Maps EC2's state name; unknown names become [`AttachmentState::Unknown`].
    pub fn from_name(name: &str) -> Self {
        match name {
            "attaching" => Self::Attaching,
            "attached" => Self::Attached,
            "detaching" => Self::Detaching,
            "detached" => Self::Detached,
            "busy" => Self::Busy,
            _ => Self::Unknown,
        }
    }

    /// True unless EC2 says the instance let go of the volume.
    pub fn holds(self) -> bool {
        match self {
            Self::Detached => false,
            Self::Attaching | Self::Attached | Self::Detaching | Self::Busy | Self::Unknown => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_is_an_ec2_instance_or_a_gce_vm_and_says_which() {
        let ec2 = InstanceId::parse("i-0123456789abcdef0").expect("an EC2 id");
        assert_eq!(ec2.provider(), Provider::Aws);
        assert_eq!(ec2.as_gce(), None);
        let vm = InstanceId::parse("gce://proj-fencer/us-central1-a/node-1").expect("a VM");
        assert_eq!(vm.provider(), Provider::Gce);
        assert_eq!(
            vm.as_gce().map(|v| v.name().to_owned()).as_deref(),
            Some("node-1")
        );
        assert_eq!(
            instance_from_provider_id("gce://proj-fencer/us-central1-a/node-1"),
            Some(vm.clone())
        );
        // EventBridge's ids are EC2's only.
        assert_eq!(
            InstanceId::ec2("gce://proj-fencer/us-central1-a/node-1"),
            None
        );
        for bad in [
            "gce://proj-fencer/us-central1-a",
            "gce://P/us-central1-a/n",
            "gce:///n",
        ] {
            assert_eq!(InstanceId::parse(bad), None, "{bad}");
            assert_eq!(instance_from_provider_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_disk_is_an_ebs_volume_or_a_persistent_disk() {
        let pd = VolumeId::parse("projects/proj-fencer/zones/us-central1-a/disks/pv-1")
            .expect("a PD handle");
        assert_eq!(pd.provider(), Provider::Gce);
        assert!(pd.as_pd().is_some());
        assert_eq!(VolumeId::ebs(pd.as_str()), None);
        let ebs = VolumeId::parse("vol-0123abcd").expect("an EBS id");
        assert_eq!(ebs.provider(), Provider::Aws);
        assert_eq!(VolumeId::pd("vol-0123abcd"), None);
        assert_eq!(
            VolumeId::parse("projects/x/zones/us-central1-a/disks/pv-1"),
            None
        );
    }

    #[test]
    fn an_unspecified_project_is_the_vms() {
        let vm = InstanceId::parse("gce://proj-fencer/us-central1-a/node-1").expect("a VM");
        let ec2 = InstanceId::parse("i-0123abcd").expect("an EC2 id");
        let migrated = VolumeId::parse("projects/UNSPECIFIED/zones/us-central1-a/disks/pd-1")
            .expect("a migrated handle");
        assert_eq!(
            migrated.clone().on_machine(Some(&vm)).as_str(),
            "projects/proj-fencer/zones/us-central1-a/disks/pd-1"
        );
        assert_eq!(migrated.clone().on_machine(Some(&ec2)), migrated);
        assert_eq!(migrated.clone().on_machine(None), migrated);
        let own = VolumeId::parse("projects/other-proj/zones/us-central1-a/disks/pd-1")
            .expect("a handle");
        assert_eq!(own.clone().on_machine(Some(&vm)), own);
    }

    #[test]
    fn only_terminated_and_stopped_vms_are_off() {
        use crate::core::model::gce::GceStatus;
        let names = [
            "PROVISIONING",
            "STAGING",
            "RUNNING",
            "STOPPING",
            "PENDING_STOP",
            "DEPROVISIONING",
            "PENDING",
            "STOPPED",
            "SUSPENDING",
            "SUSPENDED",
            "REPAIRING",
            "TERMINATED",
            "",
            "running",
            "NEW_STATUS",
        ];
        let off: Vec<&str> = names
            .into_iter()
            .filter(|n| InstanceState::from_gce(GceStatus::from_name(n)).is_off())
            .collect();
        assert_eq!(off, ["STOPPED", "TERMINATED"]);
        let suspended = InstanceState::from_gce(GceStatus::from_name("SUSPENDED"));
        assert_eq!(suspended, InstanceState::Suspended);
        assert!(
            !suspended.is_stopping(),
            "a suspended VM never becomes off by waiting"
        );
        assert!(InstanceState::from_gce(GceStatus::from_name("PENDING_STOP")).is_stopping());
    }

    #[test]
    fn instance_ids_are_strict() {
        assert!(InstanceId::parse("i-0123456789abcdef0").is_some());
        assert!(InstanceId::parse("i-0123abcd").is_some());
        for bad in [
            "",
            "i-",
            "i-am-a-node",
            "i-0123456789ABCDEF0",
            "i-0123456789abcdef",
            "x-0123abcd",
            " i-0123abcd",
            "i-0123abcd\n",
        ] {
            assert!(InstanceId::parse(bad).is_none(), "{bad:?} accepted");
        }
    }

    #[test]
    fn provider_ids() {
        let id = instance_from_provider_id("aws:///us-east-1a/i-0123456789abcdef0");
        assert_eq!(id.map(|i| i.0), Some("i-0123456789abcdef0".into()));
        assert!(instance_from_provider_id("aws:///i-0123abcd").is_some());
        assert!(instance_from_provider_id("gce://p/z/i-0123abcd").is_none());
        assert!(instance_from_provider_id("kwok://node-1").is_none());
        assert!(instance_from_provider_id("aws:///us-east-1a/").is_none());
    }

    #[test]
    fn volume_ids_accept_the_in_tree_form() {
        assert_eq!(
            VolumeId::parse("aws://us-east-1a/vol-0123456789abcdef0").map(|v| v.0),
            Some("vol-0123456789abcdef0".into())
        );
        assert!(VolumeId::parse("vol-0123abcd").is_some());
        assert!(VolumeId::parse("vol-xyz").is_none());
        assert!(VolumeId::parse("snap-0123abcd").is_none());
    }

    #[test]
    fn only_stopped_and_terminated_are_off() {
        let off: Vec<_> = InstanceState::ALL.iter().filter(|s| s.is_off()).collect();
        assert_eq!(off, [&InstanceState::Stopped, &InstanceState::Terminated]);
        for state in InstanceState::ALL {
            if !matches!(state, InstanceState::Unknown | InstanceState::Hibernated) {
                assert_eq!(InstanceState::from_name(state.name()), state);
            }
        }
        assert_eq!(InstanceState::from_name(""), InstanceState::Unknown);
        assert_eq!(InstanceState::from_name("Stopped"), InstanceState::Unknown);
    }

    #[test]
    fn a_hibernated_stop_is_not_a_plain_stop() {
        use InstanceState::{Hibernated, Running, Stopped};
        let cases = [
            (
                "stopped",
                Some("Client.UserInitiatedHibernate"),
                false,
                Hibernated,
            ),
            (
                "stopped",
                Some("Client.UserInitiatedHibernate"),
                true,
                Hibernated,
            ),
            (
                "stopped",
                Some("Server.SpotInstanceHibernate"),
                true,
                Hibernated,
            ),
            (
                "stopped",
                Some("Client.UserInitiatedShutdown"),
                true,
                Stopped,
            ),
            (
                "stopped",
                Some("Client.InstanceInitiatedShutdown"),
                false,
                Stopped,
            ),
            ("stopped", None, true, Hibernated),
            ("stopped", None, false, Stopped),
            (
                "running",
                Some("Client.UserInitiatedHibernate"),
                true,
                Running,
            ),
        ];
        for (name, code, configured, want) in cases {
            assert_eq!(
                InstanceState::from_ec2(name, code, configured),
                want,
                "{name} {code:?} {configured}"
            );
        }
    }
}
