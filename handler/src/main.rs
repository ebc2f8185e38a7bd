//! The `node-fencer` binary: the Lambda function when started by the Lambda
//! runtime (`AWS_LAMBDA_RUNTIME_API` set), the operator command line otherwise.

#![recursion_limit = "256"]

use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        match node_fencer::entry::lambda::serve().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("node-fencer: {e}");
                ExitCode::FAILURE
            }
        }
    } else {
        node_fencer::entry::cli::main().await
    }
}
