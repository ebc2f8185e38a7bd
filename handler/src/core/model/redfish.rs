//! On-premises machines' names and values, as the core reads them: the name
//! an operator's inventory gives a machine behind a BMC (`redfish://NAME`),
//! the power state its DMTF Redfish `ComputerSystem` reports, and the
//! System's UUID that holds the BMC's answer to the Node's own machine. Pure
//! and strict: the name ends up in log lines and the report, the UUID
//! decides whether an answer is about this machine at all. What a System
//! document says as facts is [`super::system`]'s.

use std::fmt;

use serde::Serialize;

/// The scheme of a Redfish machine's id.
pub const SCHEME: &str = "redfish://";

/// A machine of the inventory, by the name the operator gave it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct BmcMachine(String);

impl BmcMachine {
    /// A name of lowercase letters, digits, `-` and `.`, 1 to 63 long,
    /// starting and ending with a letter or digit: what fits a DNS label, a
    /// Kubernetes label value and a file name alike.
    pub fn new(name: &str) -> Option<Self> {
        let bytes = name.as_bytes();
        let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let ok = (1..=63).contains(&bytes.len())
            && bytes.first().is_some_and(edge)
            && bytes.last().is_some_and(edge)
            && bytes.iter().all(|b| edge(b) || *b == b'-' || *b == b'.');
        ok.then(|| Self(name.to_owned()))
    }

    /// Parses `redfish://NAME`.
    pub fn from_id(raw: &str) -> Option<Self> {
        Self::new(raw.strip_prefix(SCHEME)?)
    }

    /// The machine's id, `redfish://NAME`.
    pub fn id(&self) -> String {
        format!("{SCHEME}{}", self.0)
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BmcMachine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `ComputerSystem.PowerState`, as a BMC reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerState {
    /// `On`.
    On,
    /// `Off`: the only state taken for off.
    Off,
    /// `PoweringOn`.
    PoweringOn,
    /// `PoweringOff`: the guest may still be flushing to its disks.
    PoweringOff,
    /// `Paused` (Redfish 2020.4): the system keeps its memory and resumes.
    Paused,
    /// Absent, null, or a value this build does not know.
    Unknown,
}

impl PowerState {
    /// Reads the property's value; anything else than the schema's names,
    /// exactly, is [`PowerState::Unknown`].
    pub fn from_name(name: Option<&str>) -> Self {
        match name {
            Some("On") => Self::On,
            Some("Off") => Self::Off,
            Some("PoweringOn") => Self::PoweringOn,
            Some("PoweringOff") => Self::PoweringOff,
            Some("Paused") => Self::Paused,
            _ => Self::Unknown,
        }
    }
}

/// A machine's SMBIOS UUID, as the BMC reports it (`ComputerSystem.UUID`)
/// or the kubelet read it when it registered (`status.nodeInfo.systemUUID`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "uuid")]
pub enum SystemUuid {
    /// Not asked: the clouds' machines are told apart otherwise.
    #[default]
    Unread,
    /// Asked, and no UUID came back: absent or malformed.
    Missing,
    /// A UUID that tells no machine apart: a placeholder, or one that
    /// more than one machine shows. It counts as missing.
    Doubtful(Doubt),
    /// A UUID, as bytes in the order printed (bytes, not a `u128`: the
    /// facts that carry it stay small).
    Known([u8; 16]),
}

/// Why a UUID that was read is no identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Doubt {
    /// A value firmware ships unset (all zeros, all ones, or one of the
    /// vendors' well-known fill-ins): many boards report it.
    Placeholder,
    /// Another Node's kubelet reports the same UUID (cloned firmware, a
    /// cloned VM): which Node a System with it backs cannot be told.
    SharedByNodes,
    /// Another System of the inventory serves the same UUID.
    SharedBySystems,
}

impl Doubt {
    /// A short, stable name.
    pub fn code(self) -> &'static str {
        match self {
            Self::Placeholder => "placeholder",
            Self::SharedByNodes => "shared_by_nodes",
            Self::SharedBySystems => "shared_by_systems",
        }
    }
}

impl fmt::Display for Doubt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Placeholder => {
                "the UUID is a placeholder firmware ships unset (all zeros, all ones, or a vendor's fill-in), which many boards report"
            }
            Self::SharedByNodes => {
                "another Node's kubelet reports the same UUID (cloned firmware or a cloned VM), so a System that shows it cannot be told to be this Node's"
            }
            Self::SharedBySystems => {
                "another System of the inventory serves the same UUID, so it names no one machine"
            }
        })
    }
}

/// UUIDs firmware ships unset, seen on many boards at once: all zeros and
/// all ones (SMBIOS' "not present" and "not settable"), the AMI BIOS
/// fill-in `03000200-0400-0500-0006-000700080009`, and the
/// `12345678-1234-5678-90ab-cddeefaabbcc` some boards leave. Matched in
/// either SMBIOS byte order.
const PLACEHOLDERS: [u128; 4] = [
    0,
    u128::MAX,
    0x0300_0200_0400_0500_0006_0007_0008_0009,
    0x1234_5678_1234_5678_90ab_cdde_efaa_bbcc,
];

impl SystemUuid {
    /// Parses the canonical form (`8-4-4-4-12` hex digits, either case);
    /// a placeholder is [`Doubt::Placeholder`].
    pub fn parse(raw: Option<&str>) -> Self {
        let Some(bits) = raw.and_then(uuid_bits) else {
            return Self::Missing;
        };
        let bytes = bits.to_be_bytes();
        let placeholder = PLACEHOLDERS.iter().any(|p| {
            let p = p.to_be_bytes();
            bytes == p || bytes == swap_smbios_fields(p)
        });
        if placeholder {
            Self::Doubtful(Doubt::Placeholder)
        } else {
            Self::Known(bytes)
        }
    }

    /// Why this UUID is no identity, when it is read and doubtful.
    pub fn doubt(self) -> Option<Doubt> {
        match self {
            Self::Doubtful(d) => Some(d),
            _ => None,
        }
    }

    /// This UUID, taken for no identity for `doubt` when it is a known one.
    pub fn doubted(self, doubt: Doubt) -> Self {
        match self {
            Self::Known(_) => Self::Doubtful(doubt),
            other => other,
        }
    }

    /// The UUID as one key for both SMBIOS byte orders, when it is known:
    /// two UUIDs with the same key are the same machine's.
    pub fn key(self) -> Option<[u8; 16]> {
        match self {
            Self::Known(a) => Some(a.min(swap_smbios_fields(a))),
            _ => None,
        }
    }

    /// The UUID as [`Self::parse`] reads it back (lowercase, hyphenated),
    /// when it is known.
    pub fn printed(self) -> Option<String> {
        let Self::Known(b) = self else {
            return None;
        };
        let hex: String = b.iter().map(|byte| format!("{byte:02x}")).collect();
        Some(format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        ))
    }

    /// True when both are the same machine's UUID. SMBIOS stores the first
    /// three fields little-endian, and BMCs and kernels differ in whether
    /// they swap them back before printing: either order is the same
    /// machine. Two machines' UUIDs that differ only by that swap do not
    /// occur by chance.
    pub fn same_machine(self, other: Self) -> bool {
        match (self, other) {
            (Self::Known(a), Self::Known(b)) => a == b || a == swap_smbios_fields(b),
            _ => false,
        }
    }
}

fn uuid_bits(raw: &str) -> Option<u128> {
    let groups: Vec<&str> = raw.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lengths != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = groups.concat();
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(&hex, 16).ok()
}

/// The UUID with its first three fields' bytes reversed.
fn swap_smbios_fields(mut bytes: [u8; 16]) -> [u8; 16] {
    bytes[0..4].reverse();
    bytes[4..6].reverse();
    bytes[6..8].reverse();
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_names_are_strict() {
        let m = BmcMachine::new("rack1-u07").expect("a name");
        assert_eq!(m.id(), "redfish://rack1-u07");
        assert_eq!(BmcMachine::from_id("redfish://rack1-u07"), Some(m));
        for bad in [
            "",
            "-a",
            "a-",
            "Rack1",
            "a/b",
            "a b",
            "a_b",
            &"a".repeat(64),
            "a\u{e9}",
        ] {
            assert_eq!(BmcMachine::new(bad), None, "{bad:?}");
        }
        assert_eq!(BmcMachine::from_id("rack1-u07"), None);
        assert_eq!(BmcMachine::from_id("redfish://"), None);
        assert_eq!(BmcMachine::from_id("redfish://a/b"), None);
    }

    #[test]
    fn uuids_are_parsed_strictly_and_placeholders_are_missing() {
        let u = SystemUuid::parse(Some("27946b59-9e44-4fa7-8e91-f3527a1ef094"));
        assert_eq!(
            u,
            SystemUuid::parse(Some("27946B59-9E44-4FA7-8E91-F3527A1EF094"))
        );
        assert!(matches!(u, SystemUuid::Known(_)));
        // Printed as it is read back, whatever the case it came in.
        assert_eq!(
            u.printed().as_deref(),
            Some("27946b59-9e44-4fa7-8e91-f3527a1ef094")
        );
        assert_eq!(SystemUuid::parse(u.printed().as_deref()), u);
        assert_eq!(SystemUuid::Missing.printed(), None);
        for bad in [
            None,
            Some(""),
            Some("27946b599e444fa78e91f3527a1ef094"),
            Some("{27946b59-9e44-4fa7-8e91-f3527a1ef094}"),
            Some("27946b59-9e44-4fa7-8e91-f3527a1ef09"),
            Some("27946b59-9e44-4fa7-8e91-f3527a1ef09g"),
        ] {
            assert_eq!(SystemUuid::parse(bad), SystemUuid::Missing, "{bad:?}");
        }
        for placeholder in [
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "03000200-0400-0500-0006-000700080009",
            "00020003-0004-0005-0006-000700080009",
            "12345678-1234-5678-90AB-CDDEEFAABBCC",
        ] {
            let u = SystemUuid::parse(Some(placeholder));
            assert_eq!(u, SystemUuid::Doubtful(Doubt::Placeholder), "{placeholder}");
            assert!(!u.same_machine(u), "a placeholder is no one machine's");
        }
    }

    #[test]
    fn a_doubted_uuid_is_no_one_machine_s() {
        let u = SystemUuid::parse(Some("27946b59-9e44-4fa7-8e91-f3527a1ef094"));
        let shared = u.doubted(Doubt::SharedByNodes);
        assert_eq!(shared.doubt(), Some(Doubt::SharedByNodes));
        assert!(!shared.same_machine(u) && !u.same_machine(shared));
        assert!(!shared.same_machine(shared));
        assert_eq!(
            SystemUuid::Missing.doubted(Doubt::SharedByNodes),
            SystemUuid::Missing
        );
        assert_eq!(u.doubt(), None);
    }

    #[test]
    fn the_same_machine_in_either_byte_order_and_nothing_else() {
        let bmc = SystemUuid::parse(Some("4c4c4544-0042-3510-8052-b4c04f4d3732"));
        let kernel = SystemUuid::parse(Some("44454c4c-4200-1035-8052-b4c04f4d3732"));
        let other = SystemUuid::parse(Some("4c4c4544-0042-3510-8052-b4c04f4d3733"));
        assert!(bmc.same_machine(bmc));
        assert!(bmc.same_machine(kernel) && kernel.same_machine(bmc));
        assert!(!bmc.same_machine(other));
        assert!(!bmc.same_machine(SystemUuid::Missing));
        assert!(!SystemUuid::Missing.same_machine(SystemUuid::Missing));
        assert!(!SystemUuid::Unread.same_machine(bmc));
    }
}
