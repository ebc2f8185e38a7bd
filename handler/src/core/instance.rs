//! EC2 identifiers and instance states, parsed once into types so that no
//! decision ever compares strings.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A syntactically valid EC2 instance id (`i-` followed by 8 or 17 hex digits).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct InstanceId(String);

impl InstanceId {
    /// Parses an instance id, rejecting anything that is not `i-<8 or 17 hex>`.
    ///
    /// Strict parsing matters: the id ends up in EC2 filters and in log lines,
    /// and a loose match (`i-` prefix only) would let label values such as
    /// `i-am-a-node` pass for instances.
    pub fn parse(raw: &str) -> Option<Self> {
        let hex = raw.strip_prefix("i-")?;
        let valid_len = hex.len() == 8 || hex.len() == 17;
        let all_hex = hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (valid_len && all_hex).then(|| Self(raw.to_owned()))
    }

    /// The id as EC2 spells it.
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
                "`{raw}` is not an EC2 instance id (expected i- followed by 8 or 17 hex digits)"
            ))
        })
    }
}

/// An EBS volume id (`vol-` followed by 8 or 17 hex digits).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct VolumeId(String);

impl VolumeId {
    /// Parses a volume id; also accepts the in-tree `aws://<az>/vol-…` form.
    pub fn parse(raw: &str) -> Option<Self> {
        let id = raw.rsplit('/').next().unwrap_or(raw);
        let hex = id.strip_prefix("vol-")?;
        let valid_len = hex.len() == 8 || hex.len() == 17;
        let all_hex = hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (valid_len && all_hex).then(|| Self(id.to_owned()))
    }

    /// The id as EC2 spells it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Extracts the instance id from an AWS `spec.providerID`
/// (`aws:///us-east-1a/i-0123456789abcdef0`, or the older `aws:///i-…`).
pub fn instance_from_provider_id(provider_id: &str) -> Option<InstanceId> {
    let path = provider_id.strip_prefix("aws://")?;
    InstanceId::parse(path.rsplit('/').next()?)
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
    /// A state this build does not know; never treated as off.
    #[serde(other)]
    Unknown,
}

impl InstanceState {
    /// Maps EC2's state name; unknown names become [`InstanceState::Unknown`].
    pub fn from_name(name: &str) -> Self {
        match name {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "stopping" => Self::Stopping,
            "stopped" => Self::Stopped,
            "shutting-down" => Self::ShuttingDown,
            "terminated" => Self::Terminated,
            _ => Self::Unknown,
        }
    }

    /// True only for the states in which the instance cannot write to a disk.
    pub fn is_off(&self) -> bool {
        match self {
            Self::Stopped | Self::Terminated => true,
            Self::Pending
            | Self::Running
            | Self::Stopping
            | Self::ShuttingDown
            | Self::Hibernated
            | Self::Unknown => false,
        }
    }

    /// True for the states on the way to off (`stopping`, `shutting-down`):
    /// not off yet, soon.
    pub fn is_stopping(&self) -> bool {
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
            Self::Unknown => "unknown",
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
    pub const ALL: [InstanceState; 8] = [
        Self::Pending,
        Self::Running,
        Self::Stopping,
        Self::Stopped,
        Self::ShuttingDown,
        Self::Terminated,
        Self::Hibernated,
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
