//! What the core knows, as types: the facts the shell gathers, machines and
//! disks and their states, Kubernetes names and label selectors, Compute
//! Engine's names, and Kubernetes objects read into facts.

pub mod facts;
pub mod gce;
pub mod instance;
pub mod kube_read;
pub mod names;
pub mod redfish;
pub mod selector;
pub mod system;
pub mod values;
