//! A BMC's `ComputerSystem`, read into the facts the core decides on: the
//! machine's power state and UUID, where its reset is posted, and whether a
//! power-off may be forced on it right now. Kept apart from
//! [`super::redfish`], whose names and values the rest of the model uses.

use serde_json::Value;

use crate::core::model::facts::{InstanceFacts, MachineIdentity};
use crate::core::model::instance::{InstanceId, InstanceState};
use crate::core::model::redfish::{PowerState, SystemUuid};

/// A `ComputerSystem` resource, read into what the core decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct System {
    /// The machine as the inventory names it.
    pub facts: InstanceFacts,
    /// Where `ComputerSystem.Reset` is posted, as the System advertises it.
    pub reset_target: Option<String>,
    /// Whether the System lists `ForceOff` among its reset types; `None`
    /// when it lists none (the schema does not require the list).
    pub force_off_allowed: Option<bool>,
}

impl System {
    /// Reads a `ComputerSystem` document for the machine `id`.
    pub fn read(id: InstanceId, doc: &Value) -> Self {
        let reset = doc.pointer("/Actions/#ComputerSystem.Reset");
        let facts = InstanceFacts {
            id,
            state: InstanceState::from_redfish(PowerState::from_name(
                doc.get("PowerState").and_then(Value::as_str),
            )),
            private_dns_name: None,
            vpc_id: None,
            private_ips: Vec::new(),
            tags: Vec::new(),
            root_device_name: None,
            root_volume: None,
            identity: MachineIdentity {
                system_uuid: SystemUuid::parse(doc.get("UUID").and_then(Value::as_str)),
                ..MachineIdentity::default()
            },
            stopped_at: None,
            started_at: None,
        };
        Self {
            facts,
            reset_target: reset
                .and_then(|r| r.get("target"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            force_off_allowed: reset
                .and_then(|r| r.get("ResetType@Redfish.AllowableValues"))
                .and_then(Value::as_array)
                .map(|types| types.iter().any(|t| t.as_str() == Some("ForceOff"))),
        }
    }

    /// Where a forced power-off of this System is posted: its advertised
    /// target, under the System's own path (`system`, the one it was read
    /// from) on the BMC it was read from. A target elsewhere, even on the
    /// same BMC, is refused: a Chassis' or a Manager's reset would power
    /// off a whole enclosure, or the BMC.
    pub fn force_off_target(&self, system: &str) -> Result<&str, String> {
        if self.force_off_allowed == Some(false) {
            return Err("the System does not list ForceOff among its reset types".into());
        }
        match self.reset_target.as_deref() {
            Some(target) if is_under(target, system) => Ok(target),
            Some(target) => Err(format!(
                "the System's reset target {target:?} is not under the System's own path {system}"
            )),
            None => Err("the System advertises no ComputerSystem.Reset action".into()),
        }
    }
}

/// Whether `target` names a resource under the path `system`, as the URL
/// parser that posts to it will read it: `.` and `..` segments resolved,
/// and never a backslash (read as `/`) or an encoded dot, slash or
/// backslash (read as the character itself), which would let a target
/// such as `Systems/1/%2e%2e/%2e%2e/Chassis/1` pass as the System's.
fn is_under(target: &str, system: &str) -> bool {
    let lower = target.to_ascii_lowercase();
    if !target.starts_with('/')
        || target.contains(['\\', '?', '#'])
        || ["%2e", "%2f", "%5c"].iter().any(|e| lower.contains(e))
    {
        return false;
    }
    let own: Vec<&str> = system.trim_end_matches('/').split('/').collect();
    let mut path: Vec<&str> = Vec::new();
    for segment in target.split('/') {
        match segment {
            "." => {}
            ".." => {
                // Above the root is the root, as the parser has it.
                if path.len() > 1 {
                    path.pop();
                }
            }
            s => path.push(s),
        }
    }
    path.len() > own.len() && path.starts_with(&own) && path.last().is_some_and(|s| !s.is_empty())
}

/// What the look at a System right before its power-off allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForceOffStep {
    /// The machine judged, still powered: force it off.
    ForceOff,
    /// It is off already: the wait for it to be off ends at once.
    AlreadyOff,
}

/// Whether the System read right before a power-off may be forced off for
/// the machine judged: the same System (by its UUID: a board swapped or an
/// inventory edited since is another machine), powered (`On`, `Paused`, or
/// a graceful `PoweringOff` a hung guest may never finish). One powering on
/// is left alone: a machine on its way back is recovery's to judge.
pub fn may_force_off(judged: &MachineIdentity, now: &System) -> Result<ForceOffStep, String> {
    // A missing UUID, then or now, is never the same System.
    if !judged.may_be_same_as(&now.facts.identity) {
        return Err(
            "the BMC's System is not the machine judged (its UUID differs or is missing)".into(),
        );
    }
    match &now.facts.state {
        InstanceState::Stopped => Ok(ForceOffStep::AlreadyOff),
        InstanceState::Running | InstanceState::Suspended | InstanceState::Stopping => {
            Ok(ForceOffStep::ForceOff)
        }
        other => Err(format!("the System is `{}`, not powered", other.name())),
    }
}

/// Whether a `ForceOff` the BMC refused is done all the same, by the
/// System read right after: the System judged (its UUID), and `Off`. A
/// retry after a timeout, when the first `ForceOff` went through, may meet
/// a BMC that refuses a second one; taking that refusal for a failure
/// would take back a mark whose power-off happened. `PoweringOff` is not
/// done: it is also a graceful shutdown that a hung guest may never finish.
pub fn force_off_done(judged: &MachineIdentity, now: &System) -> bool {
    judged.may_be_same_as(&now.facts.identity) && now.facts.state == InstanceState::Stopped
}

/// The one System a `ComputerSystemCollection` lists: a BMC that lists
/// several needs the inventory to say which.
pub fn only_system(collection: &Value) -> Result<String, String> {
    let members: Vec<&str> = collection
        .get("Members")
        .and_then(Value::as_array)
        .map(|m| {
            m.iter()
                .filter_map(|m| m.get("@odata.id").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    match members[..] {
        [one] if one.starts_with("/redfish/v1/Systems/") => {
            Ok(one.trim_end_matches('/').to_owned())
        }
        [one] => Err(format!(
            "the System {one:?} is not a path /redfish/v1/Systems/ID"
        )),
        [] => Err("the BMC lists no System".into()),
        _ => Err(format!(
            "the BMC lists {} Systems: the inventory's `system` must say which",
            members.len()
        )),
    }
}

/// The `PowerState` an [`InstanceState`] read from a BMC came from.
pub fn power_state_name(state: &InstanceState) -> &'static str {
    match state {
        InstanceState::Stopped => "Off",
        InstanceState::Running => "On",
        InstanceState::Pending => "PoweringOn",
        InstanceState::Stopping => "PoweringOff",
        InstanceState::Suspended => "Paused",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> InstanceId {
        InstanceId::parse("redfish://rack1-u07").expect("an id")
    }

    #[test]
    fn a_system_is_read_into_facts_and_its_reset_action() {
        let doc = serde_json::json!({
            "@odata.id": "/redfish/v1/Systems/1",
            "Id": "1",
            "PowerState": "Off",
            "UUID": "27946b59-9e44-4fa7-8e91-f3527a1ef094",
            "Actions": {"#ComputerSystem.Reset": {
                "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown"]
            }}
        });
        let system = System::read(id(), &doc);
        assert!(system.facts.state.is_off());
        assert!(matches!(
            system.facts.identity.system_uuid,
            SystemUuid::Known(_)
        ));
        const OWN: &str = "/redfish/v1/Systems/1";
        assert_eq!(
            system.force_off_target(OWN),
            Ok("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset")
        );
        // Another resource's reset, on the same BMC, is never posted to.
        for target in [
            "/redfish/v1/Chassis/1/Actions/Chassis.Reset",
            "/redfish/v1/Managers/1/Actions/Manager.Reset",
            "/redfish/v1/Systems/10/Actions/ComputerSystem.Reset",
            "/redfish/v1/Systems/1/../../Chassis/1/Actions/Chassis.Reset",
            // Issue 58, item 6: what the URL parser turns into a Chassis'
            // reset, however it is spelt.
            "/redfish/v1/Systems/1/%2e%2e/%2e%2e/Chassis/1/Actions/Chassis.Reset",
            "/redfish/v1/Systems/1/%2E%2E/%2E%2E/Chassis/1/Actions/Chassis.Reset",
            "/redfish/v1/Systems/1/.%2e/.%2E/Chassis/1/Actions/Chassis.Reset",
            "/redfish/v1/Systems/1\\..\\..\\Chassis\\1\\Actions\\Chassis.Reset",
            "/redfish/v1/Systems/1/..\\..\\Chassis/1/Actions/Chassis.Reset",
            "/redfish/v1/Systems/1/Actions/../../../Managers/1/Actions/Manager.Reset",
            "/redfish/v1/Systems/1/%2fChassis",
            "/redfish/v1/Systems/1/",
            "/redfish/v1/Systems/1",
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset?x=../../Chassis",
            "redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            "//evil.example/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
        ] {
            let mut other = doc.clone();
            other["Actions"]["#ComputerSystem.Reset"]["target"] = serde_json::json!(target);
            let system = System::read(id(), &other);
            assert!(system.force_off_target(OWN).is_err(), "{target}");
        }

        // Dot segments that stay under the System are what the parser
        // makes of them too.
        for target in [
            "/redfish/v1/Systems/1/./Actions/ComputerSystem.Reset",
            "/redfish/v1/Systems/1/Actions/../Actions/ComputerSystem.Reset",
        ] {
            let mut other = doc.clone();
            other["Actions"]["#ComputerSystem.Reset"]["target"] = serde_json::json!(target);
            let system = System::read(id(), &other);
            assert_eq!(system.force_off_target(OWN), Ok(target));
        }

        let mut no_force = doc.clone();
        no_force["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] =
            serde_json::json!(["On", "GracefulShutdown"]);
        assert!(System::read(id(), &no_force).force_off_target(OWN).is_err());
        let mut elsewhere = doc.clone();
        elsewhere["Actions"]["#ComputerSystem.Reset"]["target"] =
            serde_json::json!("https://evil.example/reset");
        assert!(
            System::read(id(), &elsewhere)
                .force_off_target(OWN)
                .is_err()
        );
        let bare = System::read(id(), &serde_json::json!({}));
        assert_eq!(bare.facts.state, InstanceState::Unknown);
        assert_eq!(bare.facts.identity.system_uuid, SystemUuid::Missing);
        assert!(bare.force_off_target(OWN).is_err());
    }

    #[test]
    fn only_the_system_judged_and_powered_is_forced_off() {
        let doc = |power: &str, uuid: &str| serde_json::json!({"PowerState": power, "UUID": uuid});
        const UUID: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef094";
        let judged = System::read(id(), &doc("On", UUID)).facts.identity;
        let now = |power: &str, uuid: &str| {
            may_force_off(&judged, &System::read(id(), &doc(power, uuid)))
        };
        assert_eq!(now("On", UUID), Ok(ForceOffStep::ForceOff));
        assert_eq!(now("PoweringOff", UUID), Ok(ForceOffStep::ForceOff));
        assert_eq!(now("Paused", UUID), Ok(ForceOffStep::ForceOff));
        assert_eq!(now("Off", UUID), Ok(ForceOffStep::AlreadyOff));
        assert!(now("PoweringOn", UUID).is_err());
        assert!(now("Sideways", UUID).is_err());
        assert!(now("On", "27946b59-9e44-4fa7-8e91-f3527a1ef095").is_err());
        assert!(now("On", "").is_err());
        let unknown = System::read(id(), &doc("On", "")).facts.identity;
        assert!(may_force_off(&unknown, &System::read(id(), &doc("On", ""))).is_err());
    }

    /// Issue 45, item 6: a refused `ForceOff` is done when the System
    /// judged reads `Off` right after, and only then (issue 58, item 9:
    /// not `PoweringOff`, which a hung guest's shutdown may never end).
    #[test]
    fn a_refused_force_off_is_done_only_when_the_system_judged_is_off() {
        let doc = |power: &str, uuid: &str| serde_json::json!({"PowerState": power, "UUID": uuid});
        const UUID: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef094";
        let judged = System::read(id(), &doc("On", UUID)).facts.identity;
        let after = |power: &str, uuid: &str| {
            force_off_done(&judged, &System::read(id(), &doc(power, uuid)))
        };
        assert!(after("Off", UUID));
        assert!(!after("PoweringOff", UUID));
        assert!(!after("On", UUID));
        assert!(!after("PoweringOn", UUID));
        assert!(!after("Paused", UUID));
        assert!(!after("Off", "27946b59-9e44-4fa7-8e91-f3527a1ef095"));
        assert!(!after("Off", ""));
    }

    #[test]
    fn the_only_system_or_a_reason() {
        let list = |ids: &[&str]| serde_json::json!({"Members": ids.iter().map(|i| serde_json::json!({"@odata.id": i})).collect::<Vec<_>>()});
        assert_eq!(
            only_system(&list(&["/redfish/v1/Systems/1/"])),
            Ok("/redfish/v1/Systems/1".into())
        );
        assert!(only_system(&list(&[])).is_err());
        assert!(only_system(&list(&["/redfish/v1/Systems/1", "/redfish/v1/Systems/2"])).is_err());
        assert!(only_system(&list(&["/elsewhere"])).is_err());
        assert!(only_system(&serde_json::json!({})).is_err());
    }

    /// Only `Off` is off: every other value, known or not, keeps the
    /// machine from being taken for off.
    #[test]
    fn only_off_is_off() {
        for (name, off) in [
            (Some("Off"), true),
            (Some("On"), false),
            (Some("PoweringOn"), false),
            (Some("PoweringOff"), false),
            (Some("Paused"), false),
            (Some("off"), false),
            (Some("OFF"), false),
            (Some(""), false),
            (None, false),
        ] {
            let state = InstanceState::from_redfish(PowerState::from_name(name));
            assert_eq!(state.is_off(), off, "{name:?} read as {state:?}");
        }
        assert!(InstanceState::from_redfish(PowerState::PoweringOff).is_stopping());
        for name in ["On", "Off", "PoweringOn", "PoweringOff", "Paused"] {
            let state = InstanceState::from_redfish(PowerState::from_name(Some(name)));
            assert_eq!(power_state_name(&state), name);
        }
    }
}
