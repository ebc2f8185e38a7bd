//! What every fuzz target checks beyond "no panic".

use node_fencer::suspect::{Batch, NodeRef};
use node_fencer::trigger::alertmanager::is_dns_subdomain;

/// Every suspect a parser lets through names a machine in a form the rest of
/// the pipeline can use safely: a valid instance id (checked when it was
/// made), a DNS-subdomain node name, or an IP address.
pub fn assert_well_formed(batch: &Batch) {
    for s in &batch.suspects {
        if let NodeRef::Name(name) = &s.target {
            assert!(is_dns_subdomain(name), "a parser let through {name:?}");
        }
    }
}

/// Feeds `data`, when it is JSON, to a trigger parser and checks what it
/// lets through.
pub fn parse_json_with(
    data: &[u8],
    parse: fn(serde_json::Value) -> Result<Batch, node_fencer::trigger::InputError>,
) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(batch) = parse(value) {
        assert_well_formed(&batch);
    }
}
