//! The imperative shell: the only code that talks to the cloud, Kubernetes
//! and AWS secret stores. Kept thin; every choice is made in the core.

pub mod cloud;
pub mod cluster;
pub mod connect;
pub mod eks_token;
#[cfg(feature = "gce")]
pub mod oidc;
pub mod slim;
pub mod timeouts;
