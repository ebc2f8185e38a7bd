//! The operator command line: the same pipeline as the Lambda function, run
//! by hand. Raw arguments are parsed by clap, then validated into a batch.

use std::io::Read;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;
use tracing::Instrument;

use aws_config::SdkConfig;

use crate::core::inbound::suspect::{Batch, Intent};
use crate::core::inbound::trigger::{self, direct};
use crate::core::settings::access::ClusterAccess;
use crate::core::settings::config::{Config, LogFormat};
use crate::core::settings::variables::VARIABLES;
use crate::entry::app::{App, Call, HandlerError, Reply, finish};
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
    /// Output format of the report (default: text; `manifest` prints JSON only).
    #[arg(long, short, value_enum, global = true)]
    output: Option<Output>,
    /// Plan only: report what would be done, change nothing (check, fence,
    /// recover, sweep, handle; refused by the commands that change nothing
    /// anyway, and by serve, whose setting is DRY_RUN).
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
        /// (forced) when active fencing's rules allow it: ACTIVE_FENCING=stuck
        /// (a volume stuck on the node) or on, NotReady for
        /// POWER_OFF_AFTER_SECONDS, the partition guard, the
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
        /// With --confirm: the fencing confirmed, as `check` shows its
        /// `fenced at` time; a node fenced anew since is not confirmed.
        #[arg(long, requires = "confirm", value_name = "RFC3339")]
        fenced_at: Option<String>,
    },
    /// Look for NotReady nodes that no event named, fence those whose
    /// instance EC2 reports off, re-check every node node-fencer fenced,
    /// count the nodes others put out of service for the events until the
    /// next sweep, then check that every node's machine could be fenced if
    /// it died now (the witness: the cloud answers for it, the permissions
    /// a fencing needs are granted), telling each change as an Event (what
    /// the scheduled invocation does).
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
    #[cfg(feature = "serve")]
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

/// The global flags as the subcommand takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flags {
    output: Output,
    dry_run: bool,
}

/// Every global flag either reaches the subcommand or is refused there,
/// never silently dropped: a `--dry-run` that a command ignored would let it
/// write.
fn flags(cli: &Cli) -> Result<Flags, String> {
    let refuse =
        |flag: &str, why: &str| Err(format!("{flag} does not apply to this command: {why}"));
    match (&cli.command, cli.dry_run, cli.output) {
        (Command::Manifest, true, _)
        | (Command::Config, true, _)
        | (Command::Preflight, true, _) => refuse("--dry-run", "it changes nothing"),
        #[cfg(feature = "serve")]
        (Command::Serve { .. }, true, _) => refuse(
            "--dry-run",
            "set DRY_RUN=true in the service's environment (or the kill switch) instead",
        ),
        #[cfg(feature = "serve")]
        (Command::Serve { .. }, _, Some(_)) => {
            refuse("--output", "serve answers over HTTP in JSON")
        }
        (Command::Manifest, _, Some(Output::Text)) => {
            refuse("--output text", "the manifest is JSON")
        }
        (Command::Config, _, Some(Output::Json)) => {
            refuse("--output json", "the configuration is printed as text")
        }
        (Command::Manifest, _, _) => Ok(Flags {
            output: Output::Json,
            dry_run: false,
        }),
        (_, dry_run, output) => Ok(Flags {
            output: output.unwrap_or(Output::Text),
            dry_run,
        }),
    }
}

/// Runs the command line; returns the process exit code.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    let flags = match flags(&cli) {
        Ok(flags) => flags,
        Err(message) => {
            eprintln!("node-fencer: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(code) = without_configuration(&cli.command).await {
        return code;
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
    // Every command below talks to the cloud and Kubernetes.
    let sdk = match environment(&config).await {
        Ok(sdk) => sdk,
        Err(message) => {
            eprintln!("node-fencer: configuration: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Command::Preflight = cli.command {
        return preflight(sdk, config, flags.output).await;
    }
    let input = match parse_input(&cli.command) {
        Ok(input) => input,
        Err(message) => {
            eprintln!("node-fencer: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let app = match App::new(Clients::new(sdk, &config), config, hostname()).with_onprem() {
        Ok(app) => app,
        Err(message) => {
            eprintln!("node-fencer: configuration: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let correlation_id = uuid::Uuid::new_v4().to_string();
    let span = tracing::info_span!("invocation", correlation_id = %correlation_id);
    let call = Call::new(&correlation_id).plan_only(flags.dry_run);
    let result = async {
        match input {
            Input::Event(event) => app.handle(event, call).await,
            Input::Target(batch) => {
                let report = app.run(batch, call).await?;
                finish(report).map(|r| Reply::Report(Box::new(r)))
            }
        }
    }
    .instrument(span)
    .await;
    print_result(result, flags.output)
}

/// The commands that need no configuration of a deployment: `serve` reads
/// its own, `manifest` describes the build.
async fn without_configuration(command: &Command) -> Option<ExitCode> {
    match command {
        #[cfg(feature = "serve")]
        Command::Serve { port } => Some(match crate::entry::serve::serve(*port).await {
            Ok(()) => ExitCode::from(EXIT_OK),
            Err(message) => {
                eprintln!("node-fencer: {message}");
                ExitCode::from(EXIT_USAGE)
            }
        }),
        Command::Manifest => {
            let manifest = crate::core::settings::permissions::manifest();
            println!(
                "{}",
                serde_json::to_string_pretty(&manifest).unwrap_or_default()
            );
            Some(ExitCode::from(EXIT_OK))
        }
        _ => None,
    }
}

/// Runs the checks of `preflight` and prints them; 1 when one failed.
async fn preflight(sdk: SdkConfig, config: Config, output: Output) -> ExitCode {
    let clients = Clients::new(sdk, &config);
    let app = match App::new(clients, config, hostname()).with_onprem() {
        Ok(app) => app,
        Err(message) => {
            eprintln!("node-fencer: configuration: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = app.preflight().await;
    match output {
        Output::Text => print!("{}", result.to_table()),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        ),
    }
    ExitCode::from(if result.passed {
        EXIT_OK
    } else {
        EXIT_INCOMPLETE
    })
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
            fenced_at,
        } => {
            let intent = if *confirm {
                Intent::Confirm
            } else {
                Intent::Recover
            };
            let mut batch = direct::from_cli(t, intent).map_err(|e| e.to_string())?;
            batch.fenced_at = fenced_at
                .as_deref()
                .map(direct::fencing_time)
                .transpose()
                .map_err(|e| e.to_string())?;
            Ok(Input::Target(batch))
        }
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
        #[cfg(feature = "serve")]
        Command::Serve { .. } => Err("unreachable: serve has no input".into()),
        Command::Config | Command::Preflight | Command::Manifest => {
            Err("unreachable: this command has no input".into())
        }
    }
}

fn print_result(result: Result<Reply, HandlerError>, output: Output) -> ExitCode {
    let (reply, code) = match result {
        Ok(reply) => (reply, EXIT_OK),
        Err(HandlerError::Incomplete { report, .. }) => (Reply::Report(report), EXIT_INCOMPLETE),
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
    // On Google Cloud, or on-premises, nothing of AWS's is needed; a mixed
    // set-up sets both.
    let aws_needed =
        !matches!(config.cluster, ClusterAccess::Gke { .. }) && config.redfish.is_none();
    if sdk.region().is_none() && aws_needed {
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
        assert_eq!(cli.output, Some(Output::Json));
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
        // Issue 33, item 16: a confirmation may name the fencing it confirms.
        let at = "2026-11-26T10:00:00.123456789Z";
        let cli = Cli::try_parse_from([
            "node-fencer",
            "recover",
            "--confirm",
            "--fenced-at",
            at,
            "worker-1",
        ])
        .unwrap();
        assert!(
            matches!(parse_input(&cli.command), Ok(Input::Target(b)) if b.fenced_at.as_deref() == Some(at))
        );
        assert!(
            Cli::try_parse_from(["node-fencer", "recover", "--fenced-at", at, "worker-1"]).is_err()
        );
        let cli = Cli::try_parse_from([
            "node-fencer",
            "recover",
            "--confirm",
            "--fenced-at",
            "yesterday",
            "worker-1",
        ])
        .unwrap();
        assert!(parse_input(&cli.command).is_err(), "not a time");
        let cli = Cli::try_parse_from(["node-fencer", "recover", "worker-1"]).unwrap();
        assert!(
            matches!(parse_input(&cli.command), Ok(Input::Target(b)) if b.suspects[0].intent == Intent::Recover)
        );
        let cli = Cli::try_parse_from(["node-fencer", "preflight", "-o", "json"]).unwrap();
        assert!(matches!(cli.command, Command::Preflight));
    }

    /// Issue 33, item 3: `--dry-run handle` fenced for real. Each global flag
    /// reaches each subcommand, or is refused there.
    #[test]
    fn every_global_flag_reaches_every_subcommand_or_is_refused_there() {
        let flags_of = |args: &[&str]| {
            let mut argv = vec!["node-fencer"];
            argv.extend_from_slice(args);
            flags(&Cli::try_parse_from(argv).unwrap())
        };
        let planned = |output| {
            Ok(Flags {
                output,
                dry_run: true,
            })
        };
        for command in [
            &["check", "worker-1"][..],
            &["fence", "worker-1"],
            &["fence", "--power-off", "worker-1"],
            &["recover", "worker-1"],
            &["recover"],
            &["sweep"],
            &["handle", "event.json"],
        ] {
            let mut args = vec!["--dry-run"];
            args.extend_from_slice(command);
            assert_eq!(flags_of(&args), planned(Output::Text), "{command:?}");
            args.extend(["-o", "json"]);
            assert_eq!(flags_of(&args), planned(Output::Json), "{command:?}");
            assert_eq!(
                flags_of(command).map(|f| f.dry_run),
                Ok(false),
                "{command:?}"
            );
        }
        for command in ["preflight", "config", "manifest"] {
            let refused = flags_of(&["--dry-run", command]).unwrap_err();
            assert!(refused.contains("--dry-run"), "{command}: {refused}");
        }
        assert_eq!(
            flags_of(&["preflight", "-o", "json"]).map(|f| f.output),
            Ok(Output::Json)
        );
        assert_eq!(flags_of(&["manifest"]).map(|f| f.output), Ok(Output::Json));
        assert!(flags_of(&["manifest", "-o", "text"]).is_err());
        assert!(flags_of(&["config", "-o", "json"]).is_err());
        assert_eq!(flags_of(&["config"]).map(|f| f.output), Ok(Output::Text));
        #[cfg(feature = "serve")]
        {
            assert!(flags_of(&["--dry-run", "serve"]).is_err());
            assert!(flags_of(&["serve", "-o", "json"]).is_err());
            assert!(flags_of(&["serve"]).is_ok());
        }
    }
}
