//! The imperative shell: the only code that talks to the cloud, Kubernetes,
//! AWS secret stores and the notification topics. Kept thin; every choice
//! is made in the core.

pub mod cloud;
pub mod cluster;
pub mod connect;
pub mod eks_token;
pub mod notify;
#[cfg(feature = "serve")]
pub mod oidc;
pub mod onprem;
pub mod retrying;
pub mod slim;
pub mod timeouts;

/// An error with its causes: an HTTP client's own message alone ("error
/// sending request") does not say whether DNS, TCP, TLS or the timeout
/// failed.
#[cfg(any(feature = "serve", feature = "redfish"))]
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
