//! [`Cloud`] over the DMTF Redfish API of each machine's BMC: the machines
//! of the operator's inventory, in the same plain facts as the clouds'.
//! Each machine is asked on its own BMC, so one BMC that does not answer
//! (a machine that lost its power often took its BMC along) fails that
//! machine's look only. There are no disks to detach: on-premises, the
//! taint (or the legacy recipe) lets the cluster's own drivers release
//! them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};

use super::census::{self, CENSUS_PARALLEL, Census, CensusStore};
use super::{Cloud, CloudCall, CloudError, Described, Detach, PowerOff, PowerOffAnswer};
use crate::core::model::facts::{InstanceFacts, StatusChecks, VolumeFacts};
use crate::core::model::instance::{InstanceId, Provider, VolumeId};
use crate::core::model::redfish::SystemUuid;
use crate::core::model::system::{self, ForceOffStep, System};
use crate::core::rules::retry;
use crate::core::settings::redfish::{Bmc, Inventory};
use crate::shell::error_chain;
use crate::shell::retrying::retrying;

/// A BMC's connection; many take seconds to set up TLS.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One request; a BMC answers in seconds, not milliseconds.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(8);
/// How much of a BMC's error body a message quotes.
const QUOTED: usize = 300;
/// [`Cloud`] over the inventory's BMCs.
pub struct Redfish {
    bmcs: Arc<Bmcs>,
    /// The UUID each System of the inventory served when last read: a UUID
    /// is a machine's identity only when no other System serves it.
    census: Arc<Census>,
}

/// How the inventory's BMCs are reached.
struct Bmcs {
    inventory: Arc<Inventory>,
    credentials_dir: PathBuf,
    /// One client per CA bundle (`None`: the system's trust store).
    clients: BTreeMap<Option<String>, reqwest::Client>,
}

/// A BMC password, never printed.
struct Password(String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(..)")
    }
}

/// Why one request failed, and whether asking again may help.
struct Failure {
    code: Option<&'static str>,
    message: String,
    transient: bool,
}

impl Redfish {
    /// The clients for the inventory's BMCs; a CA bundle that cannot be
    /// read is an error at start, not at the first fencing.
    pub fn new(inventory: Arc<Inventory>, credentials_dir: PathBuf) -> Result<Self, String> {
        let mut clients = BTreeMap::new();
        for bmc in inventory.machines() {
            if clients.contains_key(&bmc.ca_bundle) {
                continue;
            }
            let client = client(bmc.ca_bundle.as_deref())
                .map_err(|e| format!("machine {}: {e}", bmc.machine))?;
            clients.insert(bmc.ca_bundle.clone(), client);
        }
        Ok(Self {
            bmcs: Arc::new(Bmcs {
                inventory,
                credentials_dir,
                clients,
            }),
            census: Arc::default(),
        })
    }

    /// Reads the census an earlier process left in `store` at this one's
    /// first round.
    pub fn census_kept_in(&self, store: Arc<dyn CensusStore>) {
        self.census.kept_in(store);
    }

    /// Leaves the census in `store` for the next process.
    pub async fn keep_census(&self, store: &dyn CensusStore) {
        self.census.save(store).await;
    }

    /// Holds each UUID of `found` to every other System of the inventory
    /// ([`census::hold_unique`]).
    async fn hold_unique(&self, found: &mut [InstanceFacts]) {
        let all: Vec<InstanceId> = self
            .bmcs
            .inventory
            .machines()
            .map(|b| InstanceId::redfish(&b.machine))
            .collect();
        let bmcs = self.bmcs.clone();
        let read = move |id| {
            let bmcs = bmcs.clone();
            async move { bmcs.uuid_of(id).await }
        };
        census::hold_unique(&self.census, all, found, read).await;
    }

    /// Each machine of `ids` read as a fencing reads it, its UUID held
    /// unique as in a fencing, with whether a forced power-off could be
    /// posted to it (`Err` with why not): the witness of its Node. At most
    /// [`CENSUS_PARALLEL`] BMCs are asked at once, so that a large
    /// inventory is not probed all at the same moment.
    pub async fn witness_each(&self, ids: &[InstanceId]) -> Vec<(InstanceId, WitnessLook)> {
        let looks = ids.iter().map(|id| async move {
            let call = CloudCall::DescribeMachines;
            let look = self.system(id, &call).await.map(|(_, system, path)| {
                let force_off = system.force_off_target(&path).map(drop);
                (system.facts, force_off)
            });
            (id.clone(), look)
        });
        let mut looked: Vec<(InstanceId, WitnessLook)> = futures::stream::iter(looks)
            .buffer_unordered(CENSUS_PARALLEL)
            .collect()
            .await;
        let mut found: Vec<InstanceFacts> = looked
            .iter()
            .filter_map(|(_, look)| look.as_ref().ok().map(|(facts, _)| facts.clone()))
            .collect();
        self.hold_unique(&mut found).await;
        for (_, look) in &mut looked {
            if let Ok((facts, _)) = look
                && let Some(held) = found.iter().find(|f| f.id == facts.id)
            {
                facts.identity.system_uuid = held.identity.system_uuid;
            }
        }
        looked
    }

    /// The machine's System, read, and the path it was read from.
    async fn system(
        &self,
        id: &InstanceId,
        call: &CloudCall,
    ) -> Result<(Reach<'_>, System, String), CloudError> {
        self.bmcs.system(id, call).await
    }
}

impl Bmcs {
    /// The UUID the System of `id` serves, `None` when it cannot be read.
    async fn uuid_of(&self, id: InstanceId) -> (InstanceId, Option<SystemUuid>) {
        let call = CloudCall::DescribeMachines;
        match self.system(&id, &call).await {
            Ok((_, system, _)) => {
                let uuid = system.facts.identity.system_uuid;
                (id, Some(uuid))
            }
            Err(e) => {
                tracing::warn!(machine = %id, error = %e, "the census of the inventory's UUIDs could not read this System");
                (id, None)
            }
        }
    }

    /// The machine's BMC, its client and its credentials.
    fn reach(&self, id: &InstanceId, call: &CloudCall) -> Result<Reach<'_>, CloudError> {
        let fail = |message: String| CloudError::new(Provider::Redfish, call.clone(), message);
        let bmc = id
            .as_redfish()
            .and_then(|m| self.inventory.bmc(&m))
            .ok_or_else(|| fail(format!("{id} is not a machine of the inventory")))?;
        let client = self
            .clients
            .get(&bmc.ca_bundle)
            .ok_or_else(|| fail(format!("no client for machine {}", bmc.machine)))?;
        let (user, password) = credentials(&self.credentials_dir, &bmc.credentials)
            .map_err(|e| fail(format!("machine {}: {e}", bmc.machine)))?;
        Ok(Reach {
            bmc,
            client,
            user,
            password,
        })
    }

    /// The machine's System, read, and the path it was read from.
    async fn system(
        &self,
        id: &InstanceId,
        call: &CloudCall,
    ) -> Result<(Reach<'_>, System, String), CloudError> {
        let reach = self.reach(id, call)?;
        let fail = |f: Failure| {
            CloudError::new(
                Provider::Redfish,
                call.clone(),
                format!(
                    "machine {} ({}): {}",
                    reach.bmc.machine, reach.bmc.endpoint, f.message
                ),
            )
            .with_code(f.code)
        };
        let path = match &reach.bmc.system {
            Some(path) => path.clone(),
            None => {
                let systems = reach.get("/redfish/v1/Systems").await.map_err(fail)?;
                system::only_system(&systems).map_err(|message| {
                    fail(Failure {
                        code: Some("NoSystem"),
                        message,
                        transient: false,
                    })
                })?
            }
        };
        let doc = reach.get(&path).await.map_err(fail)?;
        Ok((reach, System::read(id.clone(), &doc), path))
    }
}

/// What a witness round saw of one machine: its facts and whether a
/// forced power-off could be posted, or why it could not be read.
pub type WitnessLook = Result<(InstanceFacts, Result<(), String>), CloudError>;

/// What one machine's calls go through.
struct Reach<'a> {
    bmc: &'a Bmc,
    client: &'a reqwest::Client,
    user: String,
    password: Password,
}

impl Reach<'_> {
    async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.send(reqwest::Method::GET, path, None).await
    }

    /// One call, its transient failures retried under [`retry::REDFISH`].
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let url = format!("{}{path}", self.bmc.endpoint);
        retrying(
            &retry::REDFISH,
            || self.attempt(method.clone(), &url, body),
            |f: &Failure| f.transient,
            |failed, pause, f| {
                tracing::warn!(machine = %self.bmc.machine, failed, ?pause, error = %f.message, "retrying the BMC");
            },
        )
        .await
    }

    async fn attempt(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let what = format!("{method} {url}");
        let mut request = self
            .client
            .request(method, url)
            .basic_auth(&self.user, Some(&self.password.0))
            .header(http::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        if let Some(body) = body {
            request = request
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.map_err(|e| {
            let chain = error_chain(&e);
            // A certificate the CA bundle does not trust stays untrusted on
            // a second try: told apart, and not retried.
            let tls = !e.is_timeout() && chain.contains("certificate");
            Failure {
                code: Some(if e.is_timeout() {
                    "Timeout"
                } else if tls {
                    "TlsRejected"
                } else {
                    "Unreachable"
                }),
                message: format!("{what}: {chain}"),
                transient: !tls,
            }
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| Failure {
            code: Some("Unreachable"),
            message: format!("{what}: reading the answer: {}", error_chain(&e)),
            transient: true,
        })?;
        if status.is_success() {
            return Ok(if text.trim().is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).map_err(|e| Failure {
                    code: Some("NotJson"),
                    message: format!("{what}: the answer is not JSON: {e}"),
                    transient: false,
                })?
            });
        }
        let (code, transient) = match status.as_u16() {
            401 => ("Unauthorized", false),
            403 => ("Forbidden", false),
            404 => ("NotFound", false),
            429 => ("Throttled", true),
            500..=599 => ("ServerError", true),
            _ => ("Refused", false),
        };
        Err(Failure {
            code: Some(code),
            message: format!("{what}: {status}{}", redfish_error(&text)),
            transient,
        })
    }
}

/// The message of a Redfish error body, if the body is one, shortened.
fn redfish_error(text: &str) -> String {
    let said = serde_json::from_str::<Value>(text).ok().and_then(|v| {
        let error = v.get("error")?;
        let code = error.get("code").and_then(Value::as_str).unwrap_or("");
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        Some(format!("{code} {message}"))
    });
    match said {
        Some(said) if !said.trim().is_empty() => {
            format!(": {}", said.trim().chars().take(QUOTED).collect::<String>())
        }
        _ => String::new(),
    }
}

/// A client that trusts the bundle's CAs only, or the system's trust
/// store without one.
fn client(ca_bundle: Option<&str>) -> Result<reqwest::Client, String> {
    // reqwest's TLS brings no crypto provider of its own: the project's one
    // stack (rustls on ring) is the process default, whichever entry point
    // (the command line too) builds the first client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        // Never through a proxy, whatever HTTP_PROXY or HTTPS_PROXY say for
        // the rest of the host: a BMC's Basic credentials would travel to
        // the proxy (in clear, over an `http://` tunnel), and its requests
        // would leave the path the operator configured.
        .no_proxy()
        .user_agent(concat!("node-fencer/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(ATTEMPT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none());
    if let Some(path) = ca_bundle {
        let pem = std::fs::read(path).map_err(|e| format!("caBundle {path}: {e}"))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("caBundle {path}: {e}"))?;
        if certs.is_empty() {
            return Err(format!("caBundle {path}: no PEM certificate in it"));
        }
        builder = builder.tls_certs_only(certs);
    }
    builder
        .build()
        .map_err(|e| format!("building the BMC client: {e}"))
}

/// The credentials `name` in `dir`: the files `username` and `password`
/// of its directory, read at each use so that a rotated Secret is picked
/// up. Small local files: read at once, not on the runtime's blocking pool.
fn credentials(dir: &Path, name: &str) -> Result<(String, Password), String> {
    let read = |file: &str| {
        let path = dir.join(name).join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("credentials {}: {e}", path.display()))?;
        let value = text.trim_end_matches(['\n', '\r']).to_owned();
        if value.is_empty() {
            return Err(format!("credentials {}: empty", path.display()));
        }
        Ok(value)
    };
    Ok((read("username")?, Password(read("password")?)))
}

#[async_trait]
impl Cloud for Redfish {
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let described = self.describe_each(ids).await;
        match described.failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(described.found),
        }
    }

    /// Never asked: a BMC names no machine by a Node's name
    /// ([`crate::core::rules::namesake::must_ask`]).
    async fn machines_named(
        &self,
        _name: &str,
        _vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        Ok(Vec::new())
    }

    /// Never asked: a BMC knows its machine, not the addresses its system
    /// took ([`crate::core::rules::namesake::must_ask`]).
    async fn machines_holding(
        &self,
        _addresses: &[std::net::IpAddr],
        _vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        Ok(Vec::new())
    }

    async fn describe_each(&self, ids: &[InstanceId]) -> Described {
        let looks = ids.iter().map(|id| async move {
            let call = CloudCall::DescribeMachines;
            (
                id,
                self.system(id, &call)
                    .await
                    .map(|(_, system, _)| system.facts),
            )
        });
        let mut out = Described::default();
        for (id, look) in futures::future::join_all(looks).await {
            match look {
                Ok(facts) => out.found.push(facts),
                Err(e) => out.failed.push((vec![id.clone()], e)),
            }
        }
        self.hold_unique(&mut out.found).await;
        out
    }

    async fn describe_volumes(&self, _: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        Ok(Vec::new())
    }

    async fn detach_volume(&self, volume: &VolumeId, _: &Detach<'_>) -> Result<(), CloudError> {
        Err(CloudError::new(
            Provider::Redfish,
            CloudCall::Detach(volume.to_string()),
            "a BMC has no disks to detach",
        )
        .with_code(Some("NoDisks")))
    }

    async fn status_checks(
        &self,
        _: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
        Ok(Vec::new())
    }

    async fn power_off(&self, order: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
        let id = &order.machine.id;
        let call = CloudCall::PowerOff(id.to_string());
        let fail = |code: &str, message: String| {
            CloudError::new(Provider::Redfish, call.clone(), message).with_code(Some(code))
        };
        // Read again right before the power-off: the System behind the name
        // may have changed since the node was judged (a board swapped, the
        // inventory edited), or the machine may be on its way back.
        let (reach, system, path) = self.system(id, &call).await?;
        match system::may_force_off(&order.machine.identity, &system) {
            Ok(ForceOffStep::AlreadyOff) => return Ok(PowerOffAnswer::FoundOff),
            Ok(ForceOffStep::ForceOff) => {}
            Err(why) => return Err(fail("MachineNotRunning", format!("{id}: {why}"))),
        }
        let target = system
            .force_off_target(&path)
            .map_err(|why| fail("NoForceOff", format!("{id}: {why}")))?;
        let sent = reach
            .send(
                reqwest::Method::POST,
                target,
                Some(&json!({"ResetType": "ForceOff"})),
            )
            .await;
        if let Err(f) = sent {
            // A ForceOff retried after a timeout may be refused once the
            // first one worked: the System, read again, tells.
            let after = self.system(id, &call).await.ok();
            let done = after
                .as_ref()
                .is_some_and(|(_, now, _)| system::force_off_done(&order.machine.identity, now));
            if done {
                tracing::info!(machine = %id, error = %f.message, "the ForceOff was refused, but the System is off: taken as done");
                return Ok(PowerOffAnswer::Sent);
            }
            return Err(fail(
                f.code.unwrap_or("Refused"),
                format!("{id}: ForceOff: {}", f.message),
            ));
        }
        tracing::info!(machine = %id, bmc = %reach.bmc.endpoint, "ForceOff sent to the BMC");
        Ok(PowerOffAnswer::Sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_read_from_the_secrets_layout_and_never_printed() {
        let dir = std::env::temp_dir().join(format!("nf-bmc-{}", std::process::id()));
        let rack = dir.join("rack1");
        std::fs::create_dir_all(&rack).expect("a temp dir");
        std::fs::write(rack.join("username"), "admin\n").expect("written");
        std::fs::write(rack.join("password"), "s3cret-pass\n").expect("written");
        let (user, password) = credentials(&dir, "rack1").expect("read");
        assert_eq!(user, "admin");
        assert_eq!(password.0, "s3cret-pass");
        assert!(!format!("{password:?}").contains("s3cret"));
        let missing = credentials(&dir, "rack2").expect_err("no such credentials");
        assert!(missing.contains("rack2"), "{missing}");
        std::fs::write(rack.join("password"), "\n").expect("written");
        let empty = credentials(&dir, "rack1").expect_err("an empty password");
        assert!(
            empty.contains("empty") && !empty.contains("s3cret"),
            "{empty}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_redfish_error_body_is_quoted_short() {
        let body = json!({"error": {"code": "Base.1.8.GeneralError", "message": "x".repeat(1000)}});
        let said = redfish_error(&body.to_string());
        assert!(said.starts_with(": Base.1.8.GeneralError x"), "{said}");
        assert!(said.chars().count() <= QUOTED + 2);
        assert_eq!(redfish_error("<html>oops</html>"), "");
    }

    #[test]
    fn an_unreadable_ca_bundle_is_an_error_at_start() {
        let err = client(Some("/nonexistent/ca.pem")).expect_err("no file");
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        let dir = std::env::temp_dir().join(format!("nf-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("written");
        let err = client(empty.to_str()).expect_err("no certificate");
        assert!(err.contains("no PEM certificate"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
