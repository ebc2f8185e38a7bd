//! The settings: the environment variables node-fencer reads, the
//! configuration validated from them once at cold start (and the cluster
//! access part of it), the policy the pipeline acts on, where notifications
//! go, and the permissions the code needs (the
//! Kubernetes ones verb by verb, as they are asked).

pub mod access;
pub mod config;
pub mod grants;
pub mod notify;
pub mod permissions;
pub mod policy;
pub mod redfish;
pub mod variables;
