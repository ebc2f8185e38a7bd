//! The entry points: one invocation end to end ([`app`]), served by the
//! Lambda runtime ([`lambda`]), over HTTP on Cloud Run (`serve`, with the
//! `gce` feature) or run from the command line ([`cli`]), plus the set-up
//! check ([`preflight`]) and logging ([`telemetry`]).

pub mod app;
pub mod cli;
pub mod lambda;
pub mod preflight;
#[cfg(feature = "gce")]
pub mod serve;
pub mod telemetry;
