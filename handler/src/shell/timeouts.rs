//! How long the shell's clients wait: one bound per connection, per
//! attempt and per call, shared by every client that `connect` builds and
//! by the Compute Engine client, so neither has to import the other.

use std::time::Duration;

use crate::core::rules::retry;

/// How long to wait for an API's answers before an attempt counts as failed
/// (and is retried).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// A TCP and TLS connection.
    pub connect: Duration,
    /// One attempt of one call, answer included; EC2 and Kubernetes answer
    /// in milliseconds, so this only bounds a hung dependency.
    pub attempt: Duration,
    /// One EC2 or Compute Engine call, its retries included.
    pub call: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(3),
            attempt: Duration::from_secs(10),
            call: retry::EC2.budget,
        }
    }
}
