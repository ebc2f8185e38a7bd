//! The imperative shell: the only code that talks to EC2, Kubernetes and AWS
//! secret stores. Kept thin; every choice is made in the pure core.

pub mod cloud;
pub mod cluster;
pub mod connect;
