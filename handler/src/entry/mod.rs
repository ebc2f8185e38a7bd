//! The entry points: one invocation end to end ([`app`]), served by the
//! Lambda runtime ([`lambda`]) or run from the command line ([`cli`]), plus
//! the set-up check ([`preflight`]) and logging ([`telemetry`]).

pub mod app;
pub mod cli;
pub mod lambda;
pub mod preflight;
pub mod telemetry;
