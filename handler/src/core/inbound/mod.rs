//! What comes in: every trigger shape parsed into one normal form (the
//! suspects), the sweep's own suspects, and the OIDC tokens that push
//! requests carry.

pub mod oidc;
pub mod suspect;
pub mod sweep;
pub mod trigger;
