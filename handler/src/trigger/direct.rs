//! Direct invocations from runbooks and operators:
//! `{"action": "fence" | "check", "node": "..."}` or with `"instanceId"`.

use serde::Deserialize;
use serde_json::Value;

use super::InputError;
use super::alertmanager::is_dns_subdomain;
use crate::instance::InstanceId;
use crate::suspect::{Batch, Intent, NodeRef, Origin, Suspect};

const SHAPE: &str = "direct invocation";

/// What a direct invocation may ask for.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Fence the node if it is safe.
    Fence,
    /// Dry run: report the plan, change nothing.
    Check,
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
}

/// Parses a direct invocation; exactly one of `node` and `instanceId` is required.
pub fn parse(value: Value) -> Result<Batch, InputError> {
    let inv: Invocation =
        serde_json::from_value(value).map_err(|e| InputError::invalid(SHAPE, e))?;
    let target = match (inv.node, inv.instance_id) {
        (Some(node), None) => NodeRef::Name(node_name(&node)?),
        (None, Some(id)) => NodeRef::Instance(id),
        (Some(_), Some(_)) => {
            return Err(InputError::invalid(
                SHAPE,
                "give either `node` or `instanceId`, not both",
            ));
        }
        (None, None) => {
            return Err(InputError::invalid(SHAPE, "missing `node` or `instanceId`"));
        }
    };
    Ok(Batch {
        suspects: vec![Suspect {
            target,
            intent: match inv.action {
                Action::Fence => Intent::Fence,
                Action::Check => Intent::Check,
            },
            origin: Origin::Direct,
        }],
        ignored: vec![],
    })
}

/// Validates a node name given by a person or a runbook.
pub fn node_name(raw: &str) -> Result<String, InputError> {
    if is_dns_subdomain(raw) {
        Ok(raw.to_owned())
    } else {
        Err(InputError::invalid(
            SHAPE,
            format!("`{}` is not a valid node name", raw.escape_debug()),
        ))
    }
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
        ignored: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepted_forms() {
        let b = parse(json!({"action": "fence", "node": "worker-1"})).unwrap();
        assert_eq!(b.suspects[0].intent, Intent::Fence);
        assert_eq!(b.suspects[0].target, NodeRef::Name("worker-1".into()));
        let b = parse(json!({"action": "check", "instanceId": "i-0123abcd"})).unwrap();
        assert_eq!(b.suspects[0].intent, Intent::Check);
        let b = parse(json!({"action": "check", "instance_id": "i-0123abcd"})).unwrap();
        assert!(matches!(b.suspects[0].target, NodeRef::Instance(_)));
    }

    #[test]
    fn refused_forms() {
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
}
