//! The entry points: one invocation end to end ([`app`]), served by the
//! Lambda runtime ([`lambda`]), over HTTP on Cloud Run or on-premises (`serve`,
//! with the `serve` feature) or run from the command line ([`cli`]), plus the set-up
//! check ([`preflight`]), the witness rounds ([`witness`]: the clouds' at
//! the end of each sweep, the BMCs' in `serve` on-premises) and logging
//! ([`telemetry`]).

pub mod app;
pub mod cli;
pub mod lambda;
pub mod preflight;
#[cfg(feature = "serve")]
pub mod serve;
pub mod telemetry;
pub mod witness;
