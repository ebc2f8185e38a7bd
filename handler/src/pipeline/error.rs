//! The failures that stop an invocation before its report: something every
//! decision needs could not be read, or the cluster is older than any
//! node-fencer supports.

use crate::core::rules::compat::Unsupported;
use crate::shell::cluster::ClusterError;

/// A failure that stops the whole invocation before any decision.
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
}
