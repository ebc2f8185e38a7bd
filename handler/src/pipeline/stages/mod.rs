//! The fencing stages, in the order [`crate::pipeline::run`] calls them;
//! [`held`] is the discovery's last refusal, [`stuck`] what active fencing reads of a hung Node; [`taint`], [`legacy`] and [`pods`] are the parts the admission and act
//! stages carry out per node.

pub(crate) mod act;
pub(crate) mod admit;
pub(crate) mod decide;
pub(crate) mod discover;
pub(crate) mod hasten;
pub(crate) mod held;
pub(crate) mod legacy;
pub(crate) mod plan;
pub(crate) mod pods;
pub(crate) mod power;
pub(crate) mod screen;
pub(crate) mod stuck;
pub(crate) mod survey;
pub(crate) mod taint;
pub(crate) mod verify;
