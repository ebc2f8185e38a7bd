//! What goes out: the patches written on a Node, the Kubernetes Events
//! recorded on it, the metrics, and the report of an invocation.

pub mod events;
pub mod kube_patch;
pub mod metrics;
pub mod report;
