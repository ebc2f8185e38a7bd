//! How the core decides: whose machine an instance is, which Node a suspect
//! names, whether another machine carries a Node's name or holds its disks, which Nodes node-fencer may act on, the verdict per node, Nodes
//! another writer tainted, the cap, active fencing's power-off, the volumes stuck
//! on a hung Node, the fencing mode, the plan per node, the disks to free (and, in legacy mode, the
//! volumes to release from a dead Node's `volumesInUse`), recovery, the Lease and the
//! kill switch, when to retry, and whether each Node's witness could serve a
//! fencing now.

pub mod cap;
pub mod compat;
pub mod control;
pub mod decide;
pub mod held_disks;
pub mod identity;
pub mod in_use;
pub mod mode;
pub mod namesake;
pub mod neighbours;
pub mod ownership;
pub mod plan;
pub mod power;
pub mod reach;
pub mod recovery;
pub mod resolve;
pub mod retry;
pub mod silence;
pub mod stuck;
pub mod view;
pub mod volumes;
pub mod witness;
