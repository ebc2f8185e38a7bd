//! node-fencer: fences dead Kubernetes nodes on AWS.
//!
//! When EC2 confirms, out of band, that a node's instance is stopped or
//! terminated, node-fencer applies the `node.kubernetes.io/out-of-service`
//! taint (KEP-2268) and force-detaches the node's EBS volumes, so stateful
//! pods and their volumes move to a healthy node in seconds.
//!
//! The folders show the split:
//!
//! - [`core`]: the functional core. Parsing triggers, the decisions, the plan
//!   per node, the report; no I/O, so it builds without the `runtime`
//!   feature (the fuzz targets build it that way).
//! - [`shell`]: the only code that talks to the cloud and to Kubernetes, behind
//!   the [`shell::cloud::Cloud`] and [`shell::cluster::Cluster`] traits.
//! - [`pipeline`]: carries the core's plan out through the shell, one file per
//!   stage.
//! - [`entry`]: the entry points (Lambda, command line) and what they share.

#![deny(missing_docs)]

pub mod core;
#[cfg(feature = "runtime")]
pub mod entry;
#[cfg(feature = "runtime")]
pub mod pipeline;
#[cfg(feature = "runtime")]
pub mod shell;
