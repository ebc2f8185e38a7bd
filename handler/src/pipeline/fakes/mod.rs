//! In-memory [`Cloud`] and [`Cluster`] for the pipeline's fast tests. The
//! fake cluster keeps real `Node` objects and writes them through the same
//! pure patch decisions ([`kube_patch::taint_patch`], [`kube_patch::untaint_patch`])
//! that [`crate::shell::cluster::Kube`] sends to an apiserver, so what the
//! tests see on a Node is what the code would have written. Every call is
//! logged, and any one call (counted across both fakes) can be made to fail.

mod cloud;
mod cluster;

use std::sync::{Arc, Mutex, MutexGuard};

pub use cloud::FakeCloud;
pub use cluster::FakeCluster;

/// The call log and the fault plan, shared by both fakes.
#[derive(Default)]
pub struct Calls {
    log: Vec<String>,
    /// Fail the call with this index (0-based, counted across both fakes).
    fail_at: Option<usize>,
}

/// A handle on the shared call log.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Calls>>);

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, Calls> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Logs a call; true when the fault plan says it fails.
    fn call(&self, what: String) -> bool {
        let mut calls = self.lock();
        let index = calls.log.len();
        calls.log.push(what);
        calls.fail_at == Some(index)
    }

    /// Every call so far, in order (`Op target`).
    pub fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    /// Makes the call with this index fail (and no other); `None` heals.
    pub fn fail_at(&self, index: Option<usize>) {
        self.lock().fail_at = index;
    }
}
