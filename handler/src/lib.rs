//! node-fencer: fences dead Kubernetes nodes on AWS.
//!
//! When EC2 confirms, out of band, that a node's instance is stopped or
//! terminated, node-fencer applies the `node.kubernetes.io/out-of-service`
//! taint (KEP-2268) and force-detaches the node's EBS volumes, so stateful
//! pods and their volumes move to a healthy node in seconds.
//!
//! The crate is a functional core ([`trigger`], [`resolve`], [`decide`],
//! [`volumes`], [`kube_model`], [`recovery`], [`mode`], [`control`],
//! [`metrics`], [`retry`]) with no I/O, and a thin shell ([`shell`],
//! [`pipeline`], [`app`], [`cli`], [`lambda`]) that gathers facts and acts.

#![deny(missing_docs)]

#[cfg(feature = "runtime")]
pub mod app;
#[cfg(feature = "runtime")]
pub mod cli;
pub mod config;
pub mod control;
pub mod decide;
#[cfg(feature = "runtime")]
pub mod eks_token;
pub mod facts;
pub mod instance;
pub mod kube_model;
#[cfg(feature = "runtime")]
pub mod lambda;
pub mod metrics;
pub mod mode;
pub mod permissions;
#[cfg(feature = "runtime")]
pub mod pipeline;
#[cfg(feature = "runtime")]
pub mod preflight;
pub mod recovery;
pub mod report;
pub mod resolve;
pub mod retry;
#[cfg(feature = "runtime")]
pub mod shell;
pub mod suspect;
#[cfg(feature = "runtime")]
pub mod telemetry;
pub mod trigger;
pub mod volumes;
