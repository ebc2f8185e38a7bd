//! On-premises machines: `REDFISH_INVENTORY`, the operator's file saying
//! which BMC (and which System on it) backs which Node, and
//! `REDFISH_CREDENTIALS_DIR`, where the BMCs' credentials are read. The
//! file is parsed here, strictly: a typo in what decides whose machine is
//! whose must stop the start, not fence the wrong node.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use serde::Deserialize;

use super::variables::ConfigError;
use crate::core::model::instance::InstanceId;
use crate::core::model::names::NodeName;
use crate::core::model::redfish::BmcMachine;
use crate::core::model::selector::is_label_key;

/// Where the credentials are read when `REDFISH_CREDENTIALS_DIR` is unset.
pub const DEFAULT_CREDENTIALS_DIR: &str = "/etc/node-fencer/bmc";

/// The settings: where the inventory and the credentials are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedfishFiles {
    /// `REDFISH_INVENTORY`: the inventory's path.
    pub inventory: String,
    /// `REDFISH_CREDENTIALS_DIR`: one directory per credentials name, with
    /// the files `username` and `password` (a Secret mounted as a volume).
    pub credentials_dir: String,
}

/// The settings, or `None` when `REDFISH_INVENTORY` is unset.
pub(super) fn files(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<RedfishFiles>, ConfigError> {
    let credentials_dir = get("REDFISH_CREDENTIALS_DIR");
    match get("REDFISH_INVENTORY") {
        Some(inventory) => Ok(Some(RedfishFiles {
            inventory,
            credentials_dir: credentials_dir.unwrap_or_else(|| DEFAULT_CREDENTIALS_DIR.into()),
        })),
        None if credentials_dir.is_some() => Err(ConfigError::Requires {
            var: "REDFISH_CREDENTIALS_DIR",
            needs: "REDFISH_INVENTORY",
        }),
        None => Ok(None),
    }
}

/// The inventory as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    #[serde(default)]
    node_label: Option<String>,
    #[serde(default)]
    ca_bundle: Option<String>,
    machines: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    name: String,
    endpoint: String,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    credentials: Option<String>,
    #[serde(default)]
    ca_bundle: Option<String>,
}

/// One machine behind a BMC, as the inventory describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bmc {
    /// The machine's name.
    pub machine: BmcMachine,
    /// The BMC's base URL (`https://host[:port]`), without a trailing `/`.
    pub endpoint: String,
    /// The System's path (`/redfish/v1/Systems/ID`); `None`: the BMC's only
    /// System.
    pub system: Option<String>,
    /// The Node it backs, by name; `None`: by the inventory's label.
    pub node: Option<String>,
    /// The credentials' name, a directory of the credentials directory.
    pub credentials: String,
    /// The PEM file of the CAs its certificate chains to; `None`: the
    /// usual roots.
    pub ca_bundle: Option<String>,
}

/// Which machine backs which Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The label whose value names a Node's machine, for the machines the
    /// inventory gives no Node.
    node_label: Option<String>,
    machines: BTreeMap<BmcMachine, Bmc>,
    by_node: BTreeMap<String, BmcMachine>,
}

impl Inventory {
    /// Parses and checks the inventory's JSON.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: File = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(key) = &file.node_label
            && !is_label_key(key)
        {
            return Err(format!("nodeLabel: {key:?} is not a label key"));
        }
        if file.machines.is_empty() {
            return Err("machines: the inventory lists no machine".into());
        }
        let mut inventory = Self {
            node_label: file.node_label,
            ..Self::default()
        };
        let mut endpoints = HashSet::new();
        for entry in file.machines {
            let bmc = bmc(entry, file.ca_bundle.as_deref())?;
            let name = bmc.machine.clone();
            let target = (bmc.endpoint.clone(), bmc.system.clone());
            if !endpoints.insert(target) {
                return Err(format!(
                    "machine {name}: another machine has the same endpoint and system"
                ));
            }
            match &bmc.node {
                Some(node) => {
                    if let Some(other) = inventory.by_node.insert(node.clone(), name.clone()) {
                        return Err(format!(
                            "machine {name}: Node {node} is already backed by machine {other}"
                        ));
                    }
                }
                None if inventory.node_label.is_none() => {
                    return Err(format!(
                        "machine {name}: no node, and no nodeLabel to find its Node by"
                    ));
                }
                None => {}
            }
            if inventory.machines.insert(name.clone(), bmc).is_some() {
                return Err(format!("machine {name}: the name is used twice"));
            }
        }
        Ok(inventory)
    }

    /// The machine backing the Node of this name and these labels: the one
    /// the inventory gives this Node, else the one its label names (among
    /// the machines given no Node).
    pub fn machine_of(&self, node: &str, labels: &BTreeMap<String, String>) -> Option<InstanceId> {
        let machine = self.by_node.get(node).or_else(|| {
            let value = labels.get(self.node_label.as_deref()?)?;
            let machine = BmcMachine::new(value)?;
            let (name, bmc) = self.machines.get_key_value(&machine)?;
            bmc.node.is_none().then_some(name)
        })?;
        Some(InstanceId::redfish(machine))
    }

    /// The BMC of a machine.
    pub fn bmc(&self, machine: &BmcMachine) -> Option<&Bmc> {
        self.machines.get(machine)
    }

    /// Every machine, by name.
    pub fn machines(&self) -> impl Iterator<Item = &Bmc> {
        self.machines.values()
    }
}

fn bmc(entry: Entry, ca_bundle: Option<&str>) -> Result<Bmc, String> {
    let machine = BmcMachine::new(&entry.name).ok_or_else(|| {
        format!(
            "machine {:?}: a name is 1 to 63 lowercase letters, digits, `-` or `.`",
            entry.name
        )
    })?;
    let at = |why: String| format!("machine {machine}: {why}");
    let endpoint = endpoint(&entry.endpoint).map_err(at)?;
    if let Some(system) = &entry.system
        && !is_system_path(system)
    {
        return Err(at(format!(
            "system {system:?} is not a path /redfish/v1/Systems/ID"
        )));
    }
    if let Some(node) = &entry.node
        && NodeName::parse(node).is_none()
    {
        return Err(at(format!("node {node:?} is not a Node name")));
    }
    let credentials = match entry.credentials {
        Some(name) => BmcMachine::new(&name)
            .map(|c| c.name().to_owned())
            .ok_or_else(|| at(format!("credentials {name:?}: a name as a machine's")))?,
        None => machine.name().to_owned(),
    };
    Ok(Bmc {
        endpoint,
        system: entry.system,
        node: entry.node,
        credentials,
        ca_bundle: entry.ca_bundle.or_else(|| ca_bundle.map(str::to_owned)),
        machine,
    })
}

/// `https://HOST[:PORT]`, or `http://` to a loopback address (a local
/// tunnel): a BMC's password never crosses a network in the clear.
fn endpoint(raw: &str) -> Result<String, String> {
    let url = raw.trim_end_matches('/');
    let (scheme, authority) = url
        .split_once("://")
        .ok_or_else(|| format!("endpoint {raw:?} is not a URL"))?;
    let host = host_of(authority).ok_or_else(|| {
        format!("endpoint {raw:?}: only scheme, host and port (no path, user or query)")
    })?;
    match scheme {
        "https" => Ok(url.to_owned()),
        "http" if is_loopback(host) => Ok(url.to_owned()),
        "http" => Err(format!(
            "endpoint {raw:?}: http:// only to a loopback address; a BMC is reached over https"
        )),
        _ => Err(format!("endpoint {raw:?}: https:// expected")),
    }
}

/// The host of `HOST[:PORT]` (an IPv6 address in brackets), when that is
/// all the authority holds.
fn host_of(authority: &str) -> Option<&str> {
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return None;
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']')?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    (!host.is_empty() && port_ok).then_some(host)
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_system_path(path: &str) -> bool {
    path.strip_prefix("/redfish/v1/Systems/").is_some_and(|id| {
        !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<Inventory, String> {
        Inventory::parse(&v.to_string())
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const LABEL: &str = "node-restriction.kubernetes.io/bmc";

    fn example() -> Inventory {
        parse(json!({
            "nodeLabel": LABEL,
            "caBundle": "/etc/node-fencer/bmc-ca.pem",
            "machines": [
                {"name": "rack1-u07", "node": "worker-7", "endpoint": "https://10.20.0.7/",
                 "system": "/redfish/v1/Systems/System.Embedded.1", "credentials": "rack1"},
                {"name": "rack1-u08", "endpoint": "https://bmc-u08.example.internal:8443",
                 "caBundle": "/etc/other.pem"}
            ]
        }))
        .expect("a valid inventory")
    }

    #[test]
    fn nodes_find_their_machine_by_name_or_by_label() {
        let inv = example();
        let u07 = InstanceId::parse("redfish://rack1-u07").expect("an id");
        let u08 = InstanceId::parse("redfish://rack1-u08").expect("an id");
        assert_eq!(inv.machine_of("worker-7", &labels(&[])), Some(u07.clone()));
        assert_eq!(
            inv.machine_of("worker-8", &labels(&[(LABEL, "rack1-u08")])),
            Some(u08)
        );
        // A label naming a machine given to a Node by name is not followed:
        // the inventory's word for that machine is its Node's.
        assert_eq!(
            inv.machine_of("worker-9", &labels(&[(LABEL, "rack1-u07")])),
            None
        );
        assert_eq!(
            inv.machine_of("worker-9", &labels(&[(LABEL, "rack9")])),
            None
        );
        assert_eq!(inv.machine_of("worker-9", &labels(&[])), None);

        let bmc = inv
            .bmc(&u07.as_redfish().expect("redfish"))
            .expect("listed");
        assert_eq!(bmc.endpoint, "https://10.20.0.7");
        assert_eq!(bmc.credentials, "rack1");
        assert_eq!(
            bmc.ca_bundle.as_deref(),
            Some("/etc/node-fencer/bmc-ca.pem")
        );
        let u08 = inv
            .bmc(&BmcMachine::new("rack1-u08").expect("name"))
            .expect("listed");
        assert_eq!(u08.credentials, "rack1-u08");
        assert_eq!(u08.ca_bundle.as_deref(), Some("/etc/other.pem"));
        assert_eq!(u08.system, None);
    }

    #[test]
    fn a_bad_inventory_is_refused_with_its_reason() {
        let machine = |extra: serde_json::Value| {
            let mut m = json!({"name": "m1", "node": "n1", "endpoint": "https://10.0.0.1"});
            if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
                m.extend(extra.clone());
            }
            m
        };
        let cases = [
            (json!({"machines": []}), "no machine"),
            (
                json!({"machines": [machine(json!({"name": "M1"}))]}),
                "a name is",
            ),
            (
                json!({"machines": [machine(json!({"endpoint": "http://10.0.0.1"}))]}),
                "loopback",
            ),
            (
                json!({"machines": [machine(json!({"endpoint": "ftp://10.0.0.1"}))]}),
                "https:// expected",
            ),
            (
                json!({"machines": [machine(json!({"endpoint": "https://u:p@10.0.0.1"}))]}),
                "no path, user",
            ),
            (
                json!({"machines": [machine(json!({"endpoint": "https://10.0.0.1/redfish"}))]}),
                "no path",
            ),
            (
                json!({"machines": [machine(json!({"endpoint": "https://10.0.0.1:0"}))]}),
                "no path",
            ),
            (
                json!({"machines": [machine(json!({"system": "/redfish/v1/Chassis/1"}))]}),
                "not a path",
            ),
            (
                json!({"machines": [machine(json!({"system": "/redfish/v1/Systems/../x"}))]}),
                "not a path",
            ),
            (
                json!({"machines": [machine(json!({"node": "Bad_Node"}))]}),
                "not a Node name",
            ),
            (
                json!({"machines": [machine(json!({"node": null}))]}),
                "no nodeLabel",
            ),
            (
                json!({"machines": [machine(json!({"credentials": "../etc"}))]}),
                "credentials",
            ),
            (
                json!({"machines": [machine(json!({"password": "x"}))]}),
                "unknown field",
            ),
            (
                json!({"machines": [machine(json!({})), machine(json!({"node": "n2"}))]}),
                "same endpoint",
            ),
            (
                json!({"machines": [machine(json!({})), machine(json!({"name": "m2", "endpoint": "https://10.0.0.2"}))]}),
                "already backed",
            ),
            (
                json!({"machines": [machine(json!({})), machine(json!({"node": "n2", "endpoint": "https://10.0.0.2"}))]}),
                "used twice",
            ),
            (
                json!({"nodeLabel": "bad key!", "machines": [machine(json!({}))]}),
                "not a label key",
            ),
            (json!({"machine": []}), "unknown field"),
        ];
        for (inventory, why) in cases {
            let err = parse(inventory.clone()).expect_err(&inventory.to_string());
            assert!(err.contains(why), "{inventory}: {err}");
        }
        assert!(Inventory::parse("{").is_err());
        // A loopback tunnel may be plain http.
        for ok in [
            "http://127.0.0.1:8000",
            "http://localhost",
            "http://[::1]:8000",
        ] {
            assert!(
                parse(json!({"machines": [machine(json!({"endpoint": ok}))]})).is_ok(),
                "{ok}"
            );
        }
    }

    #[test]
    fn the_credentials_dir_needs_an_inventory() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(files(&env(&[])), Ok(None));
        assert_eq!(
            files(&env(&[("REDFISH_INVENTORY", "/etc/inv.json")])),
            Ok(Some(RedfishFiles {
                inventory: "/etc/inv.json".into(),
                credentials_dir: DEFAULT_CREDENTIALS_DIR.into(),
            }))
        );
        assert!(files(&env(&[("REDFISH_CREDENTIALS_DIR", "/x")])).is_err());
    }
}
