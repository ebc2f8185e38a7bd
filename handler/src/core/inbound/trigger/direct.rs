//! Direct invocations from runbooks and operators:
//! `{"action": "fence" | "check" | "recover", "node": "..."}` or with
//! `"instanceId"`; `{"action": "recover"}` alone re-checks every node
//! node-fencer fenced; `"confirm": true` with a recover of one node records
//! an operator's confirmation that it is healthy (manual recovery);
//! `{"action": "sweep"}` also looks for NotReady nodes to fence that no
//! event named; `{"action": "preflight"}` checks the set-up.

use serde::Deserialize;
use serde_json::Value;

use super::InputError;
use crate::core::inbound::suspect::{Batch, Intent, NodeRef, Origin, Suspect};
use crate::core::model::instance::InstanceId;
use crate::core::model::names::NodeName;

const SHAPE: &str = "direct invocation";

/// What a direct invocation may ask for.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Fence the node if it is safe.
    Fence,
    /// Dry run: report the plan, change nothing.
    Check,
    /// End node-fencer's fencing of the node once it is safe.
    Recover,
    /// Look for NotReady nodes whose machine is off and that are not fenced
    /// yet, and re-check every node node-fencer fenced.
    Sweep,
    /// Check permissions and settings; change nothing.
    Preflight,
}

/// What a direct invocation asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Nodes to fence, check or recover.
    Batch(Batch),
    /// The preflight check.
    Preflight,
}

/// The body of a direct invocation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Invocation {
    /// The action.
    pub action: Action,
    /// A node name.
    #[serde(default)]
    pub node: Option<String>,
    /// An EC2 instance id.
    #[serde(default, alias = "instance_id")]
    pub instance_id: Option<InstanceId>,
    /// With `recover` of one node: an operator confirms it healthy.
    #[serde(default)]
    pub confirm: bool,
    /// With `confirm`: the fencing confirmed (the `fenced-at` time `check`
    /// shows); the Node's fencing must be that one.
    #[serde(default)]
    pub fenced_at: Option<String>,
    /// With `fence`: power the machine off first should EC2 still report it
    /// running, when active fencing's rules allow it.
    #[serde(default)]
    pub power_off: bool,
}

/// Parses a direct invocation. `fence` and `check` need exactly one of
/// `node` and `instanceId`; `recover` takes one or none (none: every node
/// node-fencer fenced); `preflight` takes neither.
pub fn parse(value: Value) -> Result<Request, InputError> {
    let inv: Invocation =
        serde_json::from_value(value).map_err(|e| InputError::invalid(SHAPE, e))?;
    if inv.confirm
        && (inv.action != Action::Recover || (inv.node.is_none() && inv.instance_id.is_none()))
    {
        return Err(InputError::invalid(
            SHAPE,
            "`confirm` goes with `recover` of one `node` or `instanceId`",
        ));
    }
    let fenced_at = match inv.fenced_at.as_deref() {
        None => None,
        Some(_) if !inv.confirm => {
            return Err(InputError::invalid(SHAPE, "`fencedAt` goes with `confirm`"));
        }
        Some(at) => Some(fencing_time(at)?),
    };
    if inv.power_off && inv.action != Action::Fence {
        return Err(InputError::invalid(SHAPE, "`powerOff` goes with `fence`"));
    }
    let intent = match inv.action {
        Action::Fence if inv.power_off => Intent::PowerOff,
        Action::Fence => Intent::Fence,
        Action::Check => Intent::Check,
        Action::Recover if inv.confirm => Intent::Confirm,
        Action::Recover => Intent::Recover,
        Action::Sweep | Action::Preflight => {
            if inv.node.is_some() || inv.instance_id.is_some() {
                return Err(InputError::invalid(
                    SHAPE,
                    "`sweep` and `preflight` take no `node` or `instanceId`",
                ));
            }
            return Ok(match inv.action {
                Action::Sweep => Request::Batch(sweep()),
                _ => Request::Preflight,
            });
        }
    };
    let target = match (inv.node, inv.instance_id) {
        (Some(node), None) => NodeRef::Name(node_name(&node)?),
        (None, Some(id)) => NodeRef::Instance(id),
        (Some(_), Some(_)) => {
            return Err(InputError::invalid(
                SHAPE,
                "give either `node` or `instanceId`, not both",
            ));
        }
        (None, None) if intent == Intent::Recover => {
            return Ok(Request::Batch(Batch::default()));
        }
        (None, None) => {
            return Err(InputError::invalid(SHAPE, "missing `node` or `instanceId`"));
        }
    };
    Ok(Request::Batch(Batch {
        suspects: vec![Suspect {
            target,
            intent,
            origin: Origin::Direct,
        }],
        fenced_at,
        ..Batch::default()
    }))
}

/// A fencing's time as an operator gives it: an RFC 3339 time, kept as
/// written (the Node's mark is compared as a time, not as text).
pub(crate) fn fencing_time(at: &str) -> Result<String, InputError> {
    match crate::core::model::values::unix_seconds(at) {
        Some(_) => Ok(at.to_owned()),
        None => Err(InputError::invalid(
            SHAPE,
            format!("`fencedAt` must be an RFC 3339 time, as `check` shows it (got {at:?})"),
        )),
    }
}

/// The sweep: no named machine; the pipeline lists the candidates.
pub fn sweep() -> Batch {
    Batch {
        sweep: true,
        ..Batch::default()
    }
}

/// [`parse`], for fence, check and recover requests only (the fuzz targets'
/// view): a preflight request is an empty batch.
pub fn parse_batch(value: Value) -> Result<Batch, InputError> {
    parse(value).map(|r| match r {
        Request::Batch(b) => b,
        Request::Preflight => Batch::default(),
    })
}

/// Validates a node name given by a person or a runbook.
pub fn node_name(raw: &str) -> Result<NodeName, InputError> {
    NodeName::parse(raw).ok_or_else(|| {
        InputError::invalid(
            SHAPE,
            format!("`{}` is not a valid node name", raw.escape_debug()),
        )
    })
}

/// Turns a command-line target (node name or instance id) into a batch.
pub fn from_cli(target: &str, intent: Intent) -> Result<Batch, InputError> {
    let target = match InstanceId::parse(target) {
        Some(id) => NodeRef::Instance(id),
        None => NodeRef::Name(node_name(target)?),
    };
    Ok(Batch {
        suspects: vec![Suspect {
            target,
            intent,
            origin: Origin::Direct,
        }],
        ..Batch::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn power_off_goes_with_fence_only() {
        let b = parse_batch(json!({"action": "fence", "node": "n1", "powerOff": true})).unwrap();
        assert_eq!(b.suspects[0].intent, Intent::PowerOff);
        let b = parse_batch(json!({"action": "fence", "node": "n1", "powerOff": false})).unwrap();
        assert_eq!(b.suspects[0].intent, Intent::Fence);
        for action in ["check", "recover", "sweep"] {
            let err =
                parse_batch(json!({"action": action, "node": "n1", "powerOff": true})).unwrap_err();
            assert!(err.to_string().contains("powerOff"), "{action}: {err}");
        }
    }

    #[test]
    fn sweep_takes_no_target() {
        assert_eq!(
            parse_batch(json!({"action": "sweep"})).unwrap(),
            super::sweep()
        );
        assert!(super::sweep().sweep && super::sweep().suspects.is_empty());
        for bad in [
            json!({"action": "sweep", "node": "worker-1"}),
            json!({"action": "sweep", "instanceId": "i-0123456789abcdef0"}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn recover_and_preflight() {
        let b = parse_batch(json!({"action": "recover", "node": "worker-1"})).unwrap();
        assert_eq!(b.suspects[0].intent, Intent::Recover);
        assert_eq!(
            parse_batch(json!({"action": "recover"})).unwrap(),
            Batch::default()
        );
        assert_eq!(
            parse(json!({"action": "preflight"})).unwrap(),
            Request::Preflight
        );
        assert!(parse(json!({"action": "preflight", "node": "a"})).is_err());
        assert!(parse(json!({"action": "check"})).is_err());
        let b = parse_batch(json!({"action": "recover", "node": "worker-1", "confirm": true}));
        assert_eq!(b.unwrap().suspects[0].intent, Intent::Confirm);
        // A confirmation names one node, and only a recovery.
        for bad in [
            json!({"action": "recover", "confirm": true}),
            json!({"action": "fence", "node": "worker-1", "confirm": true}),
            json!({"action": "recover", "node": "worker-1", "confirm": "yes"}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn accepted_forms() {
        let parse = parse_batch;
        let b = parse(json!({"action": "fence", "node": "worker-1"})).unwrap();
        assert_eq!(b.suspects[0].intent, Intent::Fence);
        assert_eq!(
            b.suspects[0].target,
            NodeRef::Name(NodeName::parse("worker-1").unwrap())
        );
        let b = parse(json!({"action": "check", "instanceId": "i-0123abcd"})).unwrap();
        assert_eq!(b.suspects[0].intent, Intent::Check);
        let b = parse(json!({"action": "check", "instance_id": "i-0123abcd"})).unwrap();
        assert!(matches!(b.suspects[0].target, NodeRef::Instance(_)));
    }

    #[test]
    fn refused_forms() {
        let parse = parse_batch;
        for bad in [
            json!({"action": "fence"}),
            json!({"action": "fence", "node": "a", "instanceId": "i-0123abcd"}),
            json!({"action": "reboot", "node": "a"}),
            json!({"action": "fence", "node": "A B"}),
            json!({"action": "fence", "node": 3}),
            json!({"action": "fence", "instanceId": "i-nothex!"}),
            json!({"action": "fence", "node": "a", "force": true}),
        ] {
            assert!(
                matches!(parse(bad.clone()), Err(InputError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn cli_targets() {
        let b = from_cli("i-0123456789abcdef0", Intent::Check).unwrap();
        assert!(matches!(b.suspects[0].target, NodeRef::Instance(_)));
        let b = from_cli("ip-10-0-0-1.ec2.internal", Intent::Fence).unwrap();
        assert!(matches!(b.suspects[0].target, NodeRef::Name(_)));
        assert!(from_cli("bad name", Intent::Fence).is_err());
    }

    /// Issue 33, item 16: a confirmation may name the fencing it confirms.
    #[test]
    fn a_confirmation_may_name_its_fencing() {
        let at = "2026-11-26T10:00:00.123456789Z";
        let b = parse_batch(
            json!({"action": "recover", "node": "worker-1", "confirm": true, "fencedAt": at}),
        )
        .unwrap();
        assert_eq!(b.fenced_at.as_deref(), Some(at));
        for bad in [
            json!({"action": "recover", "node": "worker-1", "fencedAt": at}),
            json!({"action": "recover", "node": "worker-1", "confirm": true, "fencedAt": "yesterday"}),
        ] {
            assert!(parse_batch(bad.clone()).is_err(), "{bad}");
        }
    }
}
