//! What goes out: the patches written on a Node, the Kubernetes Events
//! recorded on it, the metrics (CloudWatch's, and Cloud Logging's for
//! log-based metrics), the notifications, and the report of an invocation.

pub mod events;
pub mod kube_patch;
pub mod log_metrics;
pub mod metrics;
pub mod notice;
pub mod report;
