//! The Lambda entry point: configuration validated and clients built once per
//! execution environment, then one [`App::handle`] per event.

use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tracing::{Instrument, info_span};

use crate::core::settings::config::{Config, LogFormat};
use crate::entry::app::{App, Call, HandlerError, Reply};
use crate::entry::telemetry;
use crate::shell::connect::{Clients, sdk_config};

/// Serves events until the runtime stops the process.
pub async fn serve() -> Result<(), lambda_runtime::Error> {
    let config = Config::from_env()?;
    telemetry::init(config.log_format.unwrap_or(LogFormat::Json), false);
    telemetry::abort_on_panic();
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let reporter =
        std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "node-fencer".into());
    let clients = Clients::new(sdk_config().await, &config);
    clients.prewarm().await;
    let app = App::new(clients, config, reporter)
        .with_metrics()
        .with_onprem()
        .map_err(|e| format!("configuration: {e}"))?;
    let app = &app;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let correlation_id = if event.context.request_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            event.context.request_id.clone()
        };
        let span = info_span!("invocation", correlation_id = %correlation_id);
        #[cfg(feature = "test-faults")]
        span.in_scope(|| test_faults::inject(&event.payload));
        let call = Call::new(&correlation_id).until(deadline(&event.context));
        let result: Result<Value, HandlerError> = app
            .handle(event.payload, call)
            .instrument(span.clone())
            .await
            .map(Reply::into_value);
        if let Err(e) = &result {
            span.in_scope(|| tracing::error!(kind = e.kind(), retryable = e.retryable(), error = %e, "invocation failed"));
        }
        result
    }))
    .await
}

/// Faults the integration tests inject into the function as it runs, where
/// no real component can produce them. Compiled only with the
/// `test-faults` feature, which only the test harness's build turns on
/// (never `make package`, the image or the on-premises build).
#[cfg(feature = "test-faults")]
mod test_faults {
    /// `{"node_fencer_test_fault": "panic"}` panics in the handler.
    pub(super) fn inject(payload: &serde_json::Value) {
        if payload
            .get("node_fencer_test_fault")
            .and_then(serde_json::Value::as_str)
            == Some("panic")
        {
            panic!("a panic the test asked for");
        }
    }
}

/// The invocation's deadline as the runtime gives it (milliseconds since the
/// epoch), on the clock the pipeline's waits use. None when the runtime names
/// none, or one already past as the invocation starts: Lambda's own (and AWS's
/// runtime emulator's) is the start plus the function's timeout, and a past
/// one is no deadline any runtime means. cargo-lambda's emulator, which
/// `make run` uses, sends a constant 600 000 ms; the run is not cut short
/// for it.
fn deadline(context: &lambda_runtime::Context) -> Option<tokio::time::Instant> {
    let left = context
        .deadline()
        .duration_since(std::time::SystemTime::now())
        .ok()
        .filter(|left| !left.is_zero())?;
    Some(tokio::time::Instant::now() + left)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::deadline;

    #[test]
    fn the_runtimes_deadline_bounds_the_run_and_none_or_a_past_one_bounds_nothing() {
        let mut context = lambda_runtime::Context::default();
        assert_eq!(deadline(&context), None, "no deadline named");
        let in_a_minute = SystemTime::now() + Duration::from_secs(60);
        context.deadline = u64::try_from(
            in_a_minute
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        let left = deadline(&context).map(|d| d - tokio::time::Instant::now());
        assert!(
            left.is_some_and(|l| l > Duration::from_secs(55) && l <= Duration::from_secs(60)),
            "{left:?}"
        );
        // A deadline already past as the invocation starts (the local
        // emulator's constant 600 000 ms) bounds nothing.
        context.deadline = 600_000;
        assert_eq!(deadline(&context), None);
    }
}
