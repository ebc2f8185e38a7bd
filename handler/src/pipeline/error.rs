//! The failures that stop an invocation before its report: something every
//! decision needs could not be read, the cluster is older than any
//! node-fencer supports, or the request's time ran out.

use crate::core::rules::compat::Unsupported;
use crate::shell::cluster::ClusterError;

/// A failure that stops the whole invocation before its report.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The node list (or the Lease, or the server version) could not be
    /// read, so nothing can be decided.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The API server is older than the oldest Kubernetes node-fencer
    /// supports: nothing is read or written past its version.
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    /// The request's time ran out with a stage still waiting on a
    /// dependency ([`super::run_until`]): cut, so that the request answers
    /// before its runtime kills it.
    #[error(
        "the request's time ran out while {during}: a dependency did not answer in time; \
         what is left is for the retry"
    )]
    OutOfTime {
        /// What the invocation was doing.
        during: &'static str,
    },
}
