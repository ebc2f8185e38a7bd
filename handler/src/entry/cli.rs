//! The operator command line: the same pipeline as the Lambda function, run
//! by hand. Raw arguments are parsed by clap, then validated into a batch.

use std::io::Read;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;
use tracing::Instrument;

use aws_config::SdkConfig;

use crate::core::config::{ClusterAccess, Config, LogFormat, VARIABLES};
use crate::core::suspect::{Batch, Intent};
use crate::core::trigger::{self, direct};
use crate::entry::app::{App, HandlerError, Reply, finish};
use crate::entry::telemetry;
use crate::shell::connect::{Clients, sdk_config};

/// Exit code when the work is done (or the plan is made).
const EXIT_OK: u8 = 0;
/// Exit code when work is left undone or a dependency failed.
const EXIT_INCOMPLETE: u8 = 1;
/// Exit code for bad input or configuration: nothing was changed.
const EXIT_USAGE: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "node-fencer",
    version,
    about = "Fence dead Kubernetes nodes on AWS and Google Cloud: out-of-service taint and disk force-detach, only when EC2 or Compute Engine confirms the machine is off.",
    after_help = after_help()
)]
struct Cli {
    /// Output format of the report.
    #[arg(long, short, value_enum, global = true, default_value_t = Output::Text)]
    output: Output,
    /// Plan only: report what would be done, change nothing.
    #[arg(long, global = true)]
    dry_run: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Dry-run the pipeline for one node: resolve, confirm with the cloud, decide, list volumes.
    Check {
        /// Node name, EC2 instance id, or GCE provider id (gce://PROJECT/ZONE/NAME).
        target: String,
    },
    /// Fence one node if EC2 or Compute Engine confirms its machine is off.
    Fence {
        /// Node name, EC2 instance id, or GCE provider id (gce://PROJECT/ZONE/NAME).
        target: String,
        /// Should EC2 still report the instance running, power it off first
        /// (forced) when active fencing's rules allow it: ACTIVE_FENCING=on,
        /// NotReady for POWER_OFF_AFTER_SECONDS, the partition guard, the
        /// cap, never twice without a reboot in between.
        #[arg(long)]
        power_off: bool,
    },
    /// End node-fencer's fencing of a node that is back: remove its taint once
    /// EC2 says the instance runs and the node has been Ready for the settle
    /// delay. Without a target, every node node-fencer fenced is re-checked.
    Recover {
        /// Node name, EC2 instance id, or GCE provider id (gce://PROJECT/ZONE/NAME).
        target: Option<String>,
        /// Confirm the node healthy first (what RECOVERY=manual waits for);
        /// the other rules still apply.
        #[arg(long, requires = "target")]
        confirm: bool,
    },
    /// Look for NotReady nodes that no event named, fence those whose
    /// instance EC2 reports off, re-check every node node-fencer fenced, and
    /// count the nodes others put out of service for the events until the
    /// next sweep (what the scheduled invocation does).
    Sweep,
    /// Check the set-up without changing anything: API server, fencing mode,
    /// every Kubernetes permission, every EC2 or Compute Engine permission
    /// (the cloud the nodes run on), secrets, settings, kill switch. Exits 1
    /// when a check fails.
    Preflight,
    /// Process a trigger payload (EventBridge, Alertmanager, Function URL, direct) from a file or stdin.
    Handle {
        /// Path to a JSON file, or `-` for stdin.
        #[arg(default_value = "-")]
        file: String,
    },
    /// Validate the configuration from the environment and print it.
    Config,
    /// Print, as JSON, what this build needs: the AWS actions, the Google
    /// Cloud permissions, the Kubernetes rules, the environment variables
    /// (infra/manifest.json).
    Manifest,
    /// Serve HTTP for Cloud Run: Pub/Sub push of Cloud Audit Log entries on
    /// /pubsub and Eventarc's on /eventarc (each with a Google-signed OIDC
    /// token, see PUSH_AUDIENCE), the scheduled sweep on /sweep (Cloud
    /// Scheduler, the same token), Alertmanager on /alertmanager (the bearer
    /// token), /healthz; SERVE_ROUTES picks which of them this service
    /// answers. Every request is worked to its end before the answer; one
    /// that leaves work undone gets a 5xx, so it is delivered again.
    #[cfg(feature = "gce")]
    Serve {
        /// The port to listen on (Cloud Run sets PORT).
        #[arg(long, env = "PORT", default_value_t = 8080)]
        port: u16,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Output {
    /// Human-readable lines.
    Text,
    /// The JSON report.
    Json,
}

fn after_help() -> String {
    let mut s = String::from("Environment:\n");
    for (var, what) in VARIABLES {
        s.push_str(&format!("  {var:<30} {what}\n"));
    }
    s.push_str("\nExit status: 0 done, 1 work left undone or a dependency failed, 2 bad input or configuration.");
    s
}

/// Runs the command line; returns the process exit code.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    #[cfg(feature = "gce")]
    if let Command::Serve { port } = cli.command {
        return match crate::entry::serve::serve(port).await {
            Ok(()) => ExitCode::from(EXIT_OK),
            Err(message) => {
                eprintln!("node-fencer: {message}");
                ExitCode::from(EXIT_USAGE)
            }
        };
    }
    if let Command::Manifest = cli.command {
        // Needs no configuration: it describes the build, not a deployment.
        let manifest = crate::core::permissions::manifest();
        println!(
            "{}",
            serde_json::to_string_pretty(&manifest).unwrap_or_default()
        );
        return ExitCode::from(EXIT_OK);
    }
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("node-fencer: configuration: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    telemetry::init(config.log_format.unwrap_or(LogFormat::Text), true);
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    if let Command::Config = cli.command {
        println!("{config:#?}");
        return ExitCode::from(EXIT_OK);
    }
    // Every command below talks to AWS and Kubernetes.
    let sdk = match environment(&config).await {
        Ok(sdk) => sdk,
        Err(message) => {
            eprintln!("node-fencer: configuration: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Command::Preflight = cli.command {
        let clients = Clients::new(sdk, &config);
        let app = App::new(clients, config, hostname());
        let result = app.preflight().await;
        match cli.output {
            Output::Text => print!("{}", result.to_table()),
            Output::Json => println!(
                "{}",
                serde_json::to_string_pretty(&result).unwrap_or_default()
            ),
        }
        return ExitCode::from(if result.passed {
            EXIT_OK
        } else {
            EXIT_INCOMPLETE
        });
    }
    let batch_or_event = match parse_input(&cli.command) {
        Ok(input) => input,
        Err(message) => {
            eprintln!("node-fencer: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let clients = Clients::new(sdk, &config);
    let app = App::new(clients, config, hostname());
    let correlation_id = uuid::Uuid::new_v4().to_string();
    let span = tracing::info_span!("invocation", correlation_id = %correlation_id);
    let result = async {
        match batch_or_event {
            Input::Event(event) => app.handle(event, &correlation_id).await,
            Input::Target(batch) => {
                let report = app.run(batch, cli.dry_run, &correlation_id).await?;
                finish(report).map(Reply::Report)
            }
        }
    }
    .instrument(span)
    .await;
    print_result(result, cli.output)
}

enum Input {
    Event(Value),
    Target(Batch),
}

/// Validates the command's input before any client is built: bad input never
/// reaches the network.
fn parse_input(command: &Command) -> Result<Input, String> {
    let target = |t: &str, intent| {
        direct::from_cli(t, intent)
            .map(Input::Target)
            .map_err(|e| e.to_string())
    };
    match command {
        Command::Check { target: t } => target(t, Intent::Check),
        Command::Fence {
            target: t,
            power_off,
        } => target(
            t,
            if *power_off {
                Intent::PowerOff
            } else {
                Intent::Fence
            },
        ),
        Command::Recover {
            target: Some(t),
            confirm,
        } => target(
            t,
            if *confirm {
                Intent::Confirm
            } else {
                Intent::Recover
            },
        ),
        Command::Recover { target: None, .. } => Ok(Input::Target(Batch::default())),
        Command::Sweep => Ok(Input::Target(direct::sweep())),
        Command::Handle { file } => {
            let mut bytes = Vec::new();
            let read = if file == "-" {
                std::io::stdin().read_to_end(&mut bytes)
            } else {
                std::fs::File::open(file).and_then(|mut f| f.read_to_end(&mut bytes))
            };
            read.map_err(|e| format!("cannot read {file}: {e}"))?;
            // Validate the shape before any client is built.
            trigger::classify_bytes(&bytes).map_err(|e| e.to_string())?;
            serde_json::from_slice(&bytes)
                .map(Input::Event)
                .map_err(|e| e.to_string())
        }
        #[cfg(feature = "gce")]
        Command::Serve { .. } => Err("unreachable: serve has no input".into()),
        Command::Config | Command::Preflight | Command::Manifest => {
            Err("unreachable: this command has no input".into())
        }
    }
}

fn print_result(result: Result<Reply, HandlerError>, output: Output) -> ExitCode {
    let (reply, code) = match result {
        Ok(reply) => (reply, EXIT_OK),
        Err(HandlerError::Incomplete { report, .. }) => (Reply::Report(*report), EXIT_INCOMPLETE),
        Err(e) => {
            eprintln!("node-fencer: {e}");
            let code = if e.retryable() {
                EXIT_INCOMPLETE
            } else {
                EXIT_USAGE
            };
            return ExitCode::from(code);
        }
    };
    match (output, reply) {
        (Output::Text, Reply::Report(report)) => print!("{}", report.to_text()),
        (Output::Text, Reply::Preflight(p)) => print!("{}", p.to_table()),
        (_, reply) => println!(
            "{}",
            serde_json::to_string_pretty(&reply.into_value()).unwrap_or_default()
        ),
    }
    ExitCode::from(code)
}

/// The AWS set-up and the Kubernetes configuration, checked before any
/// client is built: either missing is a configuration error, told in one line
/// that names what to set, rather than a dependency failing later.
async fn environment(config: &Config) -> Result<SdkConfig, String> {
    let sdk = sdk_config().await;
    // On Google Cloud nothing of AWS's is needed; a mixed set-up sets both.
    if sdk.region().is_none() && !matches!(config.cluster, ClusterAccess::Gke { .. }) {
        return Err("AWS_REGION is not set (nor a region in the AWS profile)".into());
    }
    if matches!(config.cluster, ClusterAccess::Ambient)
        && let Err(e) = kube::Config::infer().await
    {
        return Err(format!(
            "no usable Kubernetes configuration: set KUBECONFIG (or write ~/.kube/config), \
             CLUSTER_NAME, KUBECONFIG_SSM_PARAMETER or KUBECONFIG_SECRET_ID ({e})"
        ));
    }
    Ok(sdk)
}

fn hostname() -> String {
    std::env::var("HOSTNAME").unwrap_or_else(|_| "node-fencer-cli".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        for var in ["DRY_RUN", "MAX_OUT_OF_SERVICE", "WEBHOOK_TOKEN_SECRET_ID"] {
            assert!(help.contains(var), "--help should document {var}");
        }
    }

    #[test]
    fn subcommands_parse() {
        let cli =
            Cli::try_parse_from(["node-fencer", "check", "worker-1", "--output", "json"]).unwrap();
        assert_eq!(cli.output, Output::Json);
        assert!(matches!(cli.command, Command::Check { .. }));
        let cli = Cli::try_parse_from(["node-fencer", "--dry-run", "fence", "i-0123abcd"]).unwrap();
        assert!(cli.dry_run);
        assert!(Cli::try_parse_from(["node-fencer", "reboot", "x"]).is_err());
        let cli = Cli::try_parse_from(["node-fencer", "sweep"]).unwrap();
        assert!(matches!(parse_input(&cli.command), Ok(Input::Target(b)) if b.sweep));
        let cli = Cli::try_parse_from(["node-fencer", "recover"]).unwrap();
        assert!(matches!(cli.command, Command::Recover { target: None, .. }));
        let cli = Cli::try_parse_from(["node-fencer", "recover", "--confirm", "worker-1"]).unwrap();
        assert!(
            matches!(parse_input(&cli.command), Ok(Input::Target(b)) if b.suspects[0].intent == Intent::Confirm)
        );
        assert!(Cli::try_parse_from(["node-fencer", "recover", "--confirm"]).is_err());
        let cli = Cli::try_parse_from(["node-fencer", "recover", "worker-1"]).unwrap();
        assert!(
            matches!(parse_input(&cli.command), Ok(Input::Target(b)) if b.suspects[0].intent == Intent::Recover)
        );
        let cli = Cli::try_parse_from(["node-fencer", "preflight", "-o", "json"]).unwrap();
        assert!(matches!(cli.command, Command::Preflight));
    }
}
