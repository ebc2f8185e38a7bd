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

use node_fencer::core::inbound::suspect::{Batch, Intent, NodeRef, Origin, Suspect};
use node_fencer::core::model::instance::InstanceId;

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
