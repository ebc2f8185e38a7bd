//! The functional core: every decision node-fencer makes, as pure functions
//! over plain facts. Nothing here does I/O; the shell gathers the facts and
//! the pipeline carries the results out.

pub mod cap;
pub mod config;
pub mod control;
pub mod decide;
pub mod events;
pub mod facts;
pub mod gce;
pub mod instance;
pub mod kube_model;
pub mod metrics;
pub mod mode;
pub mod names;
pub mod oidc;
pub mod ownership;
pub mod permissions;
pub mod plan;
pub mod policy;
pub mod power;
pub mod recovery;
pub mod report;
pub mod resolve;
pub mod retry;
pub mod silence;
pub mod suspect;
pub mod sweep;
pub mod trigger;
pub mod values;
pub mod view;
pub mod volumes;
