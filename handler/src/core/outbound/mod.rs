//! What goes out: the Kubernetes Events recorded on a Node, the metrics, and
//! the report of an invocation.

pub mod events;
pub mod metrics;
pub mod report;
