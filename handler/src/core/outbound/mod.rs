//! What goes out: the patches written on a Node, the Kubernetes Events
//! recorded on it, the metrics (CloudWatch's, Cloud Logging's for
//! log-based metrics, and Prometheus' exposition on-premises), the
//! notifications, and the report of an invocation.

pub mod events;
pub mod kube_patch;
pub mod log_metrics;
pub mod metrics;
pub mod notice;
pub mod prometheus;
pub mod report;
