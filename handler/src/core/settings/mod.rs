//! The settings: the configuration read once at cold start, the policy the
//! pipeline acts on, and the permissions the code needs.

pub mod config;
pub mod permissions;
pub mod policy;
