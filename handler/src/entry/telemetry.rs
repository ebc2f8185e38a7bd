//! Log set-up: JSON lines for CloudWatch (every line carries the invocation's
//! correlation id through its span), readable text on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::core::settings::config::LogFormat;

/// Installs the global subscriber. Logs go to stderr on the command line
/// (stdout is the report) and to stdout in Lambda (CloudWatch reads both).
pub fn init(format: LogFormat, to_stderr: bool) {
    // The SDK's IMDS region lookup warns with a dump of the HTTP response
    // wherever no instance metadata exists (a laptop); a missing region is
    // reported as a configuration error instead.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,aws_config::imds=error"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // A second init (tests, embedding) keeps the first subscriber.
    let _ = match (format, to_stderr) {
        (LogFormat::Json, false) => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .without_time()
            .try_init(),
        (LogFormat::Json, true) => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .try_init(),
        (LogFormat::Text, _) => builder
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .try_init(),
    };
}

/// Makes a panic end the process in every build, logged first as one error
/// line of the invocation (its correlation id included). The release
/// profile aborts on a panic (`panic = "abort"`); without this a debug build
/// would let the runtime catch it and serve on, so the tests would see
/// another behaviour than production's. A process that ends mid-run is what
/// Lambda and Cloud Run recover from by design: the next event gets a fresh
/// one, and a fencing left half-done is finished by the retry.
pub fn abort_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map_or_else(|| "-".to_owned(), ToString::to_string);
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(%location, %message, "panicked: the process ends here");
        std::process::abort();
    }));
}
