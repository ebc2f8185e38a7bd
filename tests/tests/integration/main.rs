//! Integration tests against the real components (one binary, per ripgrep's
//! habit): moto for EC2, etcd + kube-apiserver for Kubernetes, and the
//! binary itself under `cargo lambda watch`.

mod aws_runtime;
mod cli;
mod connect;
mod ec2;
mod fast;
mod faults;
mod gce;
mod gce_detach;
mod gce_faults;
mod gce_power;
mod kube_api;
mod lifecycle;
mod notify;
mod oldest;
mod pipeline;
mod redfish;
mod runtime;
mod scale;
mod scenario;
mod witness;
mod zip;

use node_fencer::core::inbound::suspect::{Batch, Intent, NodeRef, Origin, Suspect};
use node_fencer::core::model::instance::InstanceId;
use serde_json::{Value, json};

/// A batch of one suspect.
pub fn one(target: NodeRef, intent: Intent) -> Batch {
    Batch {
        suspects: vec![Suspect {
            target,
            intent,
            origin: Origin::Direct,
        }],
        ..Batch::default()
    }
}

/// A suspect by instance id.
pub fn by_instance(id: &str) -> NodeRef {
    NodeRef::Instance(InstanceId::parse(id).expect("moto instance ids are valid"))
}

/// A report's entries about `node`.
pub fn results_for<'a>(report: &'a Value, node: &str) -> Vec<&'a Value> {
    report["results"]
        .as_array()
        .map(|r| r.iter().filter(|r| r["node"] == json!(node)).collect())
        .unwrap_or_default()
}

/// A report's one entry about `node`.
///
/// # Panics
/// When the report has none or more than one.
pub fn only_result<'a>(report: &'a Value, node: &str) -> &'a Value {
    let found = results_for(report, node);
    assert_eq!(found.len(), 1, "one result for {node}: {report:#}");
    found[0]
}
