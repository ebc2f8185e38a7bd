//! What every fuzz target checks beyond "no panic".

use node_fencer::core::inbound::suspect::Batch;

/// Every suspect a parser lets through is well-formed
/// ([`node_fencer::core::inbound::suspect::NodeRef::is_well_formed`]).
pub fn assert_well_formed(batch: &Batch) {
    for s in &batch.suspects {
        assert!(
            s.target.is_well_formed(),
            "a parser let through {:?}",
            s.target
        );
    }
}

/// Feeds `data`, when it is JSON, to a trigger parser and checks what it
/// lets through.
pub fn parse_json_with(
    data: &[u8],
    parse: fn(serde_json::Value) -> Result<Batch, node_fencer::core::inbound::trigger::InputError>,
) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(batch) = parse(value) {
        assert_well_formed(&batch);
    }
}
