//! Alertmanager webhook payloads (version 4) and how an alert names a node.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

use super::InputError;
use crate::core::inbound::suspect::{Batch, Ignored, Intent, NodeRef, Origin, Suspect};
use crate::core::model::instance::{InstanceId, instance_from_provider_id};
use crate::core::model::names::NodeName;

const SHAPE: &str = "Alertmanager webhook";

/// The webhook body Alertmanager posts (`version: "4"`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    /// Payload version; only `"4"` exists.
    pub version: String,
    /// How many alerts Alertmanager left out because of `max_alerts`.
    #[serde(default)]
    truncated_alerts: u64,
    /// The receiver that sent it.
    #[serde(default)]
    pub receiver: Option<String>,
    /// The alerts of the group.
    pub alerts: Vec<Alert>,
}

/// One alert of a webhook payload.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    /// `firing` or `resolved`.
    pub status: AlertStatus,
    /// The alert's labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Alertmanager's fingerprint.
    #[serde(default)]
    pub fingerprint: Option<String>,
}

/// An alert's status.
#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum AlertStatus {
    /// The alert is active.
    Firing,
    /// The alert has cleared.
    Resolved,
    /// Anything else; reported and ignored.
    #[serde(other)]
    Unknown,
}

/// Parses a webhook payload into suspects; alerts that name no node are
/// ignored one by one, never failing the batch.
pub fn parse(value: Value) -> Result<Batch, InputError> {
    let hook: Webhook = serde_json::from_value(value).map_err(|e| InputError::invalid(SHAPE, e))?;
    if hook.version != "4" {
        return Err(InputError::invalid(
            SHAPE,
            format!(
                "payload version `{}` is not supported (expected \"4\")",
                hook.version
            ),
        ));
    }
    if hook.truncated_alerts > 0 {
        tracing::warn!(
            truncated = hook.truncated_alerts,
            "Alertmanager truncated the group; set max_alerts: 0 on the receiver"
        );
    }
    let mut batch = Batch::default();
    for alert in hook.alerts {
        let origin = Origin::Alert {
            alertname: alert.labels.get("alertname").cloned(),
            fingerprint: alert.fingerprint.clone(),
        };
        let intent = match alert.status {
            AlertStatus::Firing => Intent::Fence,
            AlertStatus::Resolved => Intent::Recover,
            AlertStatus::Unknown => {
                batch.ignored.push(Ignored {
                    origin,
                    reason: "alert status is neither firing nor resolved".into(),
                });
                continue;
            }
        };
        match node_from_labels(&alert.labels) {
            Ok(target) => batch.suspects.push(Suspect {
                target,
                intent,
                origin,
            }),
            Err(reason) => batch.ignored.push(Ignored { origin, reason }),
        }
    }
    Ok(batch)
}

/// Finds the node an alert is about, by label, in order of precision:
/// `node`, `provider_id`, `instance_id`, then `instance`.
fn node_from_labels(labels: &BTreeMap<String, String>) -> Result<NodeRef, String> {
    if let Some(node) = labels.get("node") {
        return NodeName::parse(node)
            .map(NodeRef::Name)
            .ok_or_else(|| "label `node` is not a valid node name".into());
    }
    if let Some(pid) = labels.get("provider_id") {
        return instance_from_provider_id(pid)
            .map(NodeRef::Instance)
            .ok_or_else(|| "label `provider_id` is not an AWS or GCE provider id".into());
    }
    if let Some(id) = labels.get("instance_id") {
        return InstanceId::parse(id)
            .map(NodeRef::Instance)
            .ok_or_else(|| "label `instance_id` is not an EC2 instance id".into());
    }
    if let Some(instance) = labels.get("instance") {
        return from_instance_label(instance).ok_or_else(|| {
            "label `instance` is neither a node, an address nor an instance id".into()
        });
    }
    Err("the alert has no node, provider_id, instance_id or instance label".into())
}

/// Prometheus' `instance` label: an EC2 instance id, `host:port`, `[v6]:port`,
/// a bare address, or a host name.
fn from_instance_label(raw: &str) -> Option<NodeRef> {
    if let Some(id) = InstanceId::parse(raw) {
        return Some(NodeRef::Instance(id));
    }
    if let Ok(ip) = raw.parse::<IpAddr>() {
        return Some(NodeRef::Address(ip));
    }
    let host = if let Some(rest) = raw.strip_prefix('[') {
        rest.split_once("]:").map(|(h, _)| h)?
    } else {
        match raw.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() => host,
            Some(_) => return None,
            None => raw,
        }
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(NodeRef::Address(ip));
    }
    NodeName::parse(host).map(NodeRef::Name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::names::is_dns_subdomain;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn instance_label_forms() {
        let cases = [
            ("i-0123456789abcdef0", Some("instance i-0123456789abcdef0")),
            ("10.0.1.17:9100", Some("address 10.0.1.17")),
            ("10.0.1.17", Some("address 10.0.1.17")),
            ("[fd00::17]:9100", Some("address fd00::17")),
            ("fd00::17", Some("address fd00::17")),
            (
                "ip-10-0-1-17.ec2.internal:9100",
                Some("node ip-10-0-1-17.ec2.internal"),
            ),
            ("worker-2", Some("node worker-2")),
            ("worker-2:notaport", None),
            ("Worker-2", None),
            ("node; rm -rf /", None),
            ("a\nb", None),
            ("", None),
        ];
        for (raw, want) in cases {
            let got = from_instance_label(raw).map(|r| r.to_string());
            assert_eq!(got.as_deref(), want, "{raw:?}");
        }
    }

    #[test]
    fn label_precedence() {
        let l = labels(&[
            ("node", "worker-1"),
            ("instance", "10.0.0.1:9100"),
            ("instance_id", "i-0123abcd"),
        ]);
        assert_eq!(
            node_from_labels(&l),
            Ok(NodeRef::Name(NodeName::parse("worker-1").unwrap()))
        );
        let l = labels(&[
            ("provider_id", "aws:///us-east-1a/i-0123abcd"),
            ("instance", "x:1"),
        ]);
        assert_eq!(
            node_from_labels(&l).map(|r| r.to_string()),
            Ok("instance i-0123abcd".into())
        );
        assert!(node_from_labels(&labels(&[("job", "node-exporter")])).is_err());
        assert!(node_from_labels(&labels(&[("node", "../etc")])).is_err());
        assert!(node_from_labels(&labels(&[("instance_id", "i-zz")])).is_err());
    }

    #[test]
    fn one_bad_alert_does_not_fail_the_batch() {
        let payload = json!({
            "version": "4", "status": "firing", "receiver": "node-fencer",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://am", "groupKey": "{}:{}", "truncatedAlerts": 0,
            "alerts": [
                {"status": "firing", "labels": {"alertname": "KubeNodeNotReady", "node": "worker-1"},
                 "annotations": {}, "startsAt": "2026-11-22T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                 "generatorURL": "", "fingerprint": "a1"},
                {"status": "firing", "labels": {"alertname": "Watchdog"},
                 "annotations": {}, "startsAt": "2026-11-22T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                 "generatorURL": "", "fingerprint": "a2"},
                {"status": "resolved", "labels": {"alertname": "KubeNodeNotReady", "node": "worker-3"},
                 "annotations": {}, "startsAt": "2026-11-22T10:00:00Z", "endsAt": "2026-11-22T10:05:00Z",
                 "generatorURL": "", "fingerprint": "a3"},
                {"status": "pending", "labels": {"node": "worker-4"}}
            ]
        });
        let batch = parse(payload).unwrap();
        assert_eq!(batch.suspects.len(), 2);
        assert_eq!(batch.suspects[0].intent, Intent::Fence);
        assert_eq!(batch.suspects[1].intent, Intent::Recover);
        assert_eq!(batch.ignored.len(), 2);
    }

    #[test]
    fn wrong_versions_and_shapes_are_invalid() {
        assert!(parse(json!({"version": "3", "alerts": []})).is_err());
        assert!(parse(json!({"version": "4", "alerts": {}})).is_err());
        assert!(parse(json!({"alerts": []})).is_err());
        assert!(parse(json!({"version": "4", "alerts": [{"labels": {}}]})).is_err());
    }

    #[test]
    fn dns_subdomains() {
        assert!(is_dns_subdomain("ip-10-0-1-17.ec2.internal"));
        assert!(!is_dns_subdomain(&"a".repeat(254)));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a_b"));
    }
}
