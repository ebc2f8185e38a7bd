//! The one failure that stops an invocation before its report: something
//! every decision needs could not be read.

use crate::shell::cluster::ClusterError;

/// A failure that stops the whole invocation before any decision.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The node list (or the Lease, or the server version) could not be
    /// read, so nothing can be decided.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}
