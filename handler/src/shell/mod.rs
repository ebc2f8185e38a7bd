//! The imperative shell: the only code that talks to the cloud, Kubernetes,
//! AWS secret stores and the notification topics. Kept thin; every choice
//! is made in the core.

pub mod cloud;
pub mod cluster;
pub mod connect;
pub mod eks_token;
pub mod notify;
#[cfg(feature = "gce")]
pub mod oidc;
pub mod retrying;
pub mod slim;
pub mod timeouts;
