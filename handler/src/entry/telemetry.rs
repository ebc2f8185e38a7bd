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
